"""Tenants: who a request's cache belongs to, and what each API key may see.

A server started with several `--api-key`s serves several *principals*, one per key. Each is
its own cache namespace by default: its prefixes are matched, stored (host and disk tiers
included), announced and explained only within its own requests, so no key hits, or times,
another's cache (`--cache-sharing all` shares one tree between every key, by the operator's
choice). A principal is named by a digest of its key, never the key, so the names are the same
on every start whatever order the keys are given in (the disk tier's pages stay their owner's).

    namespace(principal, salt)  = None | "salt:<digest>"            one key or none, or shared
                                = "principal:<digest>" | "principal:<digest>|salt:<digest>"  several keys

A `cache_salt` is stored and shown only as its digest (`salt_namespace`). `owner(namespace)` is
the principal a namespace belongs to ("" for the shared one); a viewer sees a namespace when it
is theirs, or everything when it is None (an admin key, or a server with one key or none).
"""

from __future__ import annotations

import hashlib
from typing import Any

from radixkv.errors import InvalidRequestError

SHARING = ("per-key", "all")
"""`--cache-sharing`: each key its own namespace (the default), or one tree for every key."""
MAX_SALT_CHARS = 256
SALT_PREFIX = "salt:"
PRINCIPAL_PREFIX = "principal:"
SEPARATOR = "|"


def principal_of(key: str) -> str:
    """A principal's name from its API key: a digest, so neither logs nor namespaces hold a key."""
    return PRINCIPAL_PREFIX + hashlib.sha256(b"radixkv-principal\0" + key.encode()).hexdigest()[:20]


def salt_namespace(salt: Any) -> str | None:
    """The namespace a `cache_salt` names (None: none given): requests with one salt share
    prefixes only with each other. The salt itself is never stored or shown, only its digest."""
    if salt is None:
        return None
    if not isinstance(salt, str) or not salt or len(salt) > MAX_SALT_CHARS:
        raise InvalidRequestError(f"cache_salt: must be a non-empty string of at most {MAX_SALT_CHARS} characters")
    return SALT_PREFIX + hashlib.sha256(b"radixkv-salt\0" + salt.encode()).hexdigest()[:24]


def namespace(principal: str, salted: str | None) -> str | None:
    """The cache namespace of a request by `principal` ("" when principals share one tree) with
    the salt namespace `salted` (None without one)."""
    if not principal:
        return salted
    return principal if salted is None else f"{principal}{SEPARATOR}{salted}"


def owner(space: Any) -> str:
    """The principal a namespace belongs to; "" for those every principal shares (None, a salt's,
    or any other an in-process caller names, e.g. `Engine.generate(namespace=...)`)."""
    if not isinstance(space, str) or not space.startswith(PRINCIPAL_PREFIX):
        return ""
    return space.split(SEPARATOR, 1)[0]


def visible(space: Any, viewer: str | None) -> bool:
    """Whether `viewer` (a principal; None: sees everything) may see what `space` holds."""
    return viewer is None or owner(space) == viewer


LORA_PREFIX = "lora:"


def lora_namespace(space: str | None, adapter_id: str | None) -> str | None:
    """`space` for a request run under LoRA adapter `adapter_id` (None: the base model, `space`
    unchanged): every layer's K and V depend on the adapter, so each adapter's prefixes are
    cached apart from the base model's and every other adapter's, within the same owner."""
    if adapter_id is None:
        return space
    tag = LORA_PREFIX + adapter_id
    return tag if space is None else f"{space}{SEPARATOR}{tag}"
