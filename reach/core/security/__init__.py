"""Identities and scopes, reach tokens, trust levels, the network rule and lock-outs."""
