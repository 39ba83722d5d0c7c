"""The server, one owner per package, each importing only the ones below it:

    launch.py   `radixkv serve`: composes the three below and runs uvicorn until a signal
    api/        the APIs (native, OpenAI, Responses, Anthropic, SGLang) over one request pipeline
    http/       the FastAPI app and what every endpoint shares (bodies, errors, SSE, metrics, admin)
    runtime/    the processes (scheduler, detokenizer), their sockets, and the tokenizer manager
"""
