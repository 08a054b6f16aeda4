"""MCP sweeps (``reach.hub.interop.mcp.servers``): read every MCP server's tool list again
(its heartbeat, and any change of its tools under the squatting rule).

As the probe sweep, the task only claims and submits: each read (an MCP session:
initialize, tools/list) runs on the process's own refresh threads, so a slow server never
holds a worker slot that delivery could use, and a server still being read is not read
twice at once.
"""

from __future__ import annotations

import logging
import threading
from functools import lru_cache

from celery import shared_task

from reach.hub.fleet.probing import ProbePool
from reach.hub.interop.mcp import servers as mcp_servers
from reach.worker.sweeps import skip_when_unavailable

log = logging.getLogger("reach.tasks.mcp")
_reading: set[str] = set()  # instances whose tool list a refresh thread is reading
_guard = threading.Lock()


@lru_cache(maxsize=1)
def refresh_pool(size: int) -> ProbePool:
    return ProbePool(size)


@shared_task(name="reach.mcp_tools", ignore_result=True)
@skip_when_unavailable
def mcp_tools() -> dict[str, int]:
    from reach.worker.app import runtime

    ctx = runtime()
    with ctx.transaction() as session:
        due = mcp_servers.due_refreshes(session)
    pool = refresh_pool(ctx.policy.probe_limit)
    submitted = skipped = 0
    for item in due:
        with _guard:
            if item.instance_id in _reading:
                skipped += 1
                continue
            _reading.add(item.instance_id)
        if pool.try_submit(lambda i=item: _refresh(i)) is None:
            with _guard:
                _reading.discard(item.instance_id)
            skipped += 1  # every thread busy: the next tick reads it
        else:
            submitted += 1
    return {"submitted": submitted, "skipped": skipped}


def _refresh(item: mcp_servers.Due) -> None:
    from reach.worker.app import runtime

    ctx = runtime()
    mcp = ctx.settings.mcp_agents
    try:
        mcp_servers.refresh_one(
            ctx.db, item, ctx.clock.now, ctx.policy, mcp.refresh_s, mcp.timeout_s
        )
    except Exception:
        log.exception("reading the tools of %s failed", item.instance_id)
    finally:
        with _guard:
            _reading.discard(item.instance_id)
