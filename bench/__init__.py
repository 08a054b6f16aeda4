"""Agent-Reach benchmarks: the hub side by side with direct HTTP and plain Celery.

``python -m bench`` (or ``reach bench``) starts a hub on the real Redis and PostgreSQL,
mock agents and an open-loop load generator, and writes ``bench/results/latest.json``,
a Markdown table and PNG plots. Nothing here is a unit test: timings are measured and
reported, never asserted.
"""
