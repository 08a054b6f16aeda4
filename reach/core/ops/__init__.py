"""Operator-side rules: retention cut-offs, listing pages, durations, charts, single-holder
leases."""
