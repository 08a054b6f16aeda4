"""The records SDKs and the hub exchange over HTTP, defined once for both."""
