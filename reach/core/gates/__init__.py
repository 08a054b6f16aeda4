"""The approval gate's and session liveness's rules."""
