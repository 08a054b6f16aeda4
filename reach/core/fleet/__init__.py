"""Decisions about agents and instances: ReachScore, liveness, reachability, routing,
matching, addresses."""
