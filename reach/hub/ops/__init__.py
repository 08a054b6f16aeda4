"""What an operator reads and the hub keeps tidy: listings, alerts, dead letters, metrics,
retention."""
