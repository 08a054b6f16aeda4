"""Distributed tracing rules: the W3C ``traceparent`` header and when tracing is on."""
