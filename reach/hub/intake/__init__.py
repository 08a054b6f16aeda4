"""Accepting a task: validation, screening and the durable write at submit."""
