"""Celery tasks of the hub: thin shells that decode, call the domain, and map the outcome."""
