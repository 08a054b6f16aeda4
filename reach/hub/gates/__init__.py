"""Gates a task passes before it runs: human approval and session liveness."""
