"""The Model Context Protocol: the hub as an MCP server (``reach.core.interop.mcp`` holds
the decisions: tool names and schemas, results, progress).

* ``tools``: the tools of a scope, read from the registry (one per capability type of
  the agents in scope that have a live instance).
* ``server``: the ``mcp`` SDK's low-level server whose ``tools/call`` is a reach through
  the hub's intake (routing, retries, dead letters, approval, loop checks) under the
  caller's key, and the Streamable HTTP session manager that serves it (stateless: any
  API replica answers any request). ``reach.hub.api.routes.mcp`` mounts it at ``/mcp``.
"""
