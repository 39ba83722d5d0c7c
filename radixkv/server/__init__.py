"""The HTTP server: processes, the tokenizer manager, the detokenizer and the HTTP apps."""
