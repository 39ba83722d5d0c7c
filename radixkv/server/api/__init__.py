"""The APIs the server speaks, each a translation into and out of one request pipeline
(`pipeline`), each module importing none of the others:

| module | endpoints |
|---|---|
| `native.py` | POST /generate, /tokenize, /detokenize, /abort_request |
| `openai.py` | GET /v1/models; POST /v1/chat/completions, /v1/completions |
| `responses.py` | POST /v1/responses; GET, DELETE /v1/responses/{id} |
| `anthropic.py` | POST /v1/messages, /v1/messages/count_tokens |
| `sglang.py` | GET /model_info, /get_load, /v1/loads, /health_generate; POST /concate_and_append_request |

Their request bodies are `protocol.py` (shared, native, OpenAI), `responses_protocol.py` and
`anthropic_protocol.py`; chat templates and tools are `conversation.py` and `tools.py`.
"""

from radixkv.server.api import anthropic, native, openai, responses, sglang

APIS = (native.API, openai.API, responses.API, anthropic.API, sglang.API)
"""What `radixkv.server.http.app.create_app` serves, in this order."""
