"""Task records and how readers learn of changes: the ledger, wake-ups, long-polls and
progress streams."""
