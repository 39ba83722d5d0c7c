"""Prefill/decode disaggregation: a prefill server's KV pages travel to a decode server.

    wire.py       the typed messages between a decode server and its prefill server's bootstrap port
    transfer.py   the Mooncake transfer engine over this server's KV pool: page runs written remote
    sender.py     prefill side: the bootstrap server; writes a finished prompt's pages where asked
    receiver.py   decode side: asks for a prompt's missing pages, hears when they have arrived
    sides.py      what the scheduler calls on each side (`PrefillSide`, `DecodeSide`)

A request's `bootstrap_host` / `bootstrap_port` / `bootstrap_room` are `radixkv.bootstrap`'s
(a plain record the HTTP process and the messages carry). One request's trip (both servers got it from the router, with the same room):
  prefill  computes the prompt (its radix cache serving what it can), caches it, locks the
           cached path and offers its pages under the room
  decode   matches its own tree, reserves pages for what it lacks up to the last prompt token,
           and asks the prefill server's bootstrap port for exactly those, naming where they go
  prefill  checks the ask (same model and KV layout, same prompt and namespace), writes the
           pages into the decode server's pool with the transfer engine, answers, unlocks
  decode   puts the pages into its tree and admits the request: a cache hit for all but the
           last prompt token, which it computes for the first output token's logits
"""
