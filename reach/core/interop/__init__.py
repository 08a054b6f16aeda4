"""The A2A protocol and the agent channel's frames, as pure decisions."""
