"""The Model Context Protocol, both ways. The hub as an MCP server
(``reach.core.interop.mcp.serving`` holds the decisions: tool names and schemas, results, progress):

* ``tools``: the tools of a scope, read from the registry (one per capability type of
  the agents in scope that have a live instance).
* ``server``: the ``mcp`` SDK's low-level server whose ``tools/call`` is a reach through
  the hub's intake (routing, retries, dead letters, approval, loop checks) under the
  caller's key, and the Streamable HTTP session manager that serves it (stateless: any
  API replica answers any request). ``reach.hub.api.routes.mcp`` mounts it at ``/mcp``.

And MCP servers as agents (``reach.core.interop.mcp.servers`` holds those decisions: tools
as capabilities, results as envelopes, what a re-read list may change):

* ``client``: the hub as an MCP client (``initialize``, ``tools/list``, ``ping``,
  ``tools/call``), every connection judged by the network rule;
* ``servers``: MCP servers registered as agents, probed, their tool lists re-read.
"""
