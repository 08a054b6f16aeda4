"""The Model Context Protocol's decisions, both ways: ``serving`` (the hub as an MCP server,
its capabilities as tools) and ``servers`` (an MCP server as an agent, its tools as
capabilities). Pure: ``reach.hub.interop.mcp`` speaks the wire."""
