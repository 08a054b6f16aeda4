"""Where an A2A credential may be presented: the origin its JSON-RPC URL had when given."""

from __future__ import annotations

import pytest

from reach.core.interop.a2a import origin_of


@pytest.mark.parametrize(
    ("url", "origin"),
    [
        ("http://agent.example/rpc", "http://agent.example:80"),
        ("https://Agent.Example/rpc", "https://agent.example:443"),
        ("https://agent.example:443/a2a/v1", "https://agent.example:443"),
        ("http://127.0.0.1:8080/", "http://127.0.0.1:8080"),
        ("http://[::1]:8080/", "http://[::1]:8080"),
    ],
)
def test_origin_of(url: str, origin: str) -> None:
    assert origin_of(url) == origin


def test_another_host_port_or_scheme_is_another_origin() -> None:
    given = origin_of("https://agent.example/rpc")
    moved = (
        "https://evil.example/rpc",
        "https://agent.example:8443/rpc",
        "http://agent.example/rpc",
        "https://agent.example.evil.example/rpc",
    )
    for url in moved:
        assert origin_of(url) != given
    assert origin_of("https://agent.example/other/path") == given
