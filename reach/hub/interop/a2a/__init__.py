"""Agent2Agent interop, both ways (``reach.core.interop.a2a`` holds the decisions).

* ``cards``: an A2A agent registered by its card (fetched, validated with ``a2a-sdk``'s
  types, re-read by beat: each good read is the instance's heartbeat).
* ``exchange``: delivery to an A2A instance (``SendMessage`` or ``SendStreamingMessage``)
  and the follow of a task it is still working on (``GetTask``), inside delivery's
  claim, fencing, retries, breaker and dead letters.
* ``server``: every hub agent (and every capability) as an A2A agent: its card and its
  JSON-RPC endpoint, dispatched by ``a2a-sdk``'s own JSON-RPC dispatcher.
"""

from __future__ import annotations

PROTOCOL = "a2a"  # instances.protocol of an instance reached over A2A
