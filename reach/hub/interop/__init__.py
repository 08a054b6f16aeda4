"""Reaching agents over other protocols: A2A both ways, and the agent channel for agents
behind NAT."""
