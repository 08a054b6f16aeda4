"""Signed outbound POSTs the hub makes on its own: task callbacks and the approval webhook."""
