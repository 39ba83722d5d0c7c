"""The HTTP core every API shares: the FastAPI app (`app`), reading bodies within limits, the
error format and status mapping, server-sent events, leaving with the client (`common`), the
metrics (`metrics`), and the admin routes and dashboard (`admin`)."""
