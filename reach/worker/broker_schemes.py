"""``redis://`` and ``rediss://`` broker URLs resolved to the hub's Redis transport
(`reach.worker.redis_broker`), set by name: the transport, kombu's and redis-py with it
(0.12 to 0.19 s of every hub process's start), loads with the first Redis connection, and
a hub on the embedded broker never loads it.

Set as kombu's scheme aliases rather than in ``broker_transport``: the broker URL keeps its
scheme, so a ``rediss`` URL keeps kombu's TLS handling and Flower (which picks its broker
client by scheme) still reads the queues.
"""

from __future__ import annotations

from typing import Final

from kombu import transport as kombu_transport

SCHEMES: Final = ("redis", "rediss")
TRANSPORT: Final = "reach.worker.redis_broker:Transport"


def install() -> None:
    """Resolve ``redis://`` and ``rediss://`` to the hub's transport in this process
    (idempotent)."""
    for scheme in SCHEMES:
        kombu_transport.TRANSPORT_ALIASES[scheme] = TRANSPORT
        # kombu caches what a name resolved to: one resolved before this resolves again
        kombu_transport._transport_cache.pop(scheme, None)
