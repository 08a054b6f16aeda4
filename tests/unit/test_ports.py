"""The test suite's own port picker (tests.support.ports): no port handed out twice, blocks
never overlap later picks, ports in use skipped, all below the kernel's ephemeral range."""

from __future__ import annotations

import socket

from tests.support import ports


def test_ports_never_repeat_and_blocks_never_overlap_later_picks() -> None:
    block = ports.free_block(5)
    picked = [ports.free_port() for _ in range(200)]
    handed = [*range(block, block + 5), *picked]
    assert len(set(handed)) == len(handed)
    assert all(ports.LOW <= p < ports.HIGH for p in handed)


def test_a_port_in_use_is_skipped() -> None:
    nxt = ports._ports.start + ports._next % len(ports._ports)
    if nxt + 2 >= ports._ports.stop:
        ports.free_block(ports._ports.stop - nxt)  # move past the wrap first
        nxt = ports._ports.start + ports._next % len(ports._ports)
    with socket.socket() as held:
        held.bind(("127.0.0.1", nxt))
        held.listen()
        assert ports.free_port() != nxt
