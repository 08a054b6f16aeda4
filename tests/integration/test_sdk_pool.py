"""The caller's SDK keeps one pooled connection to a hub per process, against a real hub.

Counted from the kernel's side: the TCP connections this process holds to the hub's port.
"""

from __future__ import annotations

import json
import os
import threading
from typing import Any

import psutil
import pytest

import reach
from reach.sdk.hub_client import shared_session

pytestmark = pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)


def local_ports(hub: str, pid: int | None = None) -> set[int]:
    """Local ports of the established connections from process ``pid`` to the hub."""
    port = int(hub.rsplit(":", 1)[1])
    return {
        c.laddr.port
        for c in psutil.Process(pid).net_connections(kind="tcp")
        if c.raddr and c.raddr.port == port and c.status == psutil.CONN_ESTABLISHED
    }


def some_calls(hub: str) -> None:
    """One of each SDK call that can run without a worker (refusals are answers too)."""
    with pytest.raises(reach.NoSuitableAgent):
        reach.send(agent_id="nobody", method="m", hub=hub)
    with pytest.raises(reach.ReachError):
        reach.get_task("no-such-task", hub=hub)
    with pytest.raises(reach.ReachError):
        reach.report_progress("no-such-task", 0.5, hub=hub)
    with pytest.raises(reach.ReachError):
        reach.report_result("no-such-task", {"x": 1}, hub=hub)


def test_calls_reuse_one_connection(hub_api: str) -> None:
    some_calls(hub_api)
    first = local_ports(hub_api)
    assert len(first) == 1, first
    for _ in range(3):
        some_calls(hub_api)
        assert local_ports(hub_api) == first
    assert shared_session(hub_api) is shared_session(hub_api + "/")


def test_threads_share_the_pool(hub_api: str) -> None:
    errors: list[BaseException] = []

    def calls() -> None:
        try:
            for _ in range(5):
                some_calls(hub_api)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=calls) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    # At most one connection per thread calling at once, kept for the next calls.
    assert 1 <= len(local_ports(hub_api)) <= 6
    before = local_ports(hub_api)
    some_calls(hub_api)
    assert local_ports(hub_api) <= before


def test_a_forked_child_opens_its_own_connection(hub_api: str) -> None:
    some_calls(hub_api)
    (parents,) = local_ports(hub_api)
    parent_session = shared_session(hub_api)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report, never return into pytest
        report: dict[str, Any] = {}
        try:
            report["same_session"] = shared_session(hub_api) is parent_session
            some_calls(hub_api)
            report["ports"] = sorted(local_ports(hub_api))
        except BaseException as exc:
            report["error"] = repr(exc)
        finally:
            os.write(write_end, json.dumps(report).encode())
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        report = json.loads(pipe.read() or b"{}")
    os.waitpid(pid, 0)
    assert "error" not in report, report
    assert report["same_session"] is False
    # The child inherited the parent's socket but talked over a connection of its own.
    assert parents in report["ports"] and len(report["ports"]) == 2, report
    # And the parent's connection is still its own, in working order.
    some_calls(hub_api)
    assert local_ports(hub_api) == {parents}
