"""Delivery decisions: retries and backoff, and what an agent's answer means."""
