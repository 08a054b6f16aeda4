"""Who may do what, and the keys that prove it: API keys, signing, certificates, sealing,
trust, networks, audit."""
