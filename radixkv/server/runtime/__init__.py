"""The runtime behind the HTTP front: the scheduler and detokenizer processes (`processes`,
`scheduler_process`, `detokenizer`), the sockets between them (`sockets`), and the HTTP
process's side of it (`tokenizer_manager`)."""
