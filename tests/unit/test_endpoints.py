"""Tables for agent address parsing and the loopback / unspecified classification."""

from __future__ import annotations

import pytest

from reach.core.endpoints import Endpoint, parse_endpoint


@pytest.mark.parametrize(
    ("text", "expected", "url"),
    [
        ("10.0.0.5:7001", Endpoint("http", "10.0.0.5", 7001), "http://10.0.0.5:7001"),
        ("agent.example:80", Endpoint("http", "agent.example", 80), "http://agent.example:80"),
        ("  host:1  ", Endpoint("http", "host", 1), "http://host:1"),
        ("Host.Example:65535", Endpoint("http", "host.example", 65535), None),
        ("[::1]:8000", Endpoint("http", "::1", 8000), "http://[::1]:8000"),
        ("[2001:db8::7]:7001", Endpoint("http", "2001:db8::7", 7001), "http://[2001:db8::7]:7001"),
        ("http://10.0.0.5:7001", Endpoint("http", "10.0.0.5", 7001), "http://10.0.0.5:7001"),
        ("https://agent.example:443", Endpoint("https", "agent.example", 443), None),
        (
            "https://agent.example:8443/reach/v1",
            Endpoint("https", "agent.example", 8443, "/reach/v1"),
            "https://agent.example:8443/reach/v1",
        ),
        ("http://h:1/a/", Endpoint("http", "h", 1, "/a"), "http://h:1/a"),
        ("h:1/", Endpoint("http", "h", 1), "http://h:1"),
        ("http://[::1]:9/x", Endpoint("http", "::1", 9, "/x"), "http://[::1]:9/x"),
    ],
)
def test_parse_endpoint(text: str, expected: Endpoint, url: str | None) -> None:
    endpoint = parse_endpoint(text)
    assert endpoint == expected
    if url is not None:
        assert endpoint.url == url
    # The URL is itself a parseable address that means the same thing.
    assert parse_endpoint(endpoint.url) == endpoint


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("", "empty"),
        ("   ", "empty"),
        ("host", "must name a port"),
        ("host:", "must name a port"),
        ("http://host", "must name a port"),
        ("[::1]", "must name a port"),
        ("host:0", "port 0"),
        ("host:abc", "invalid port"),
        ("host:65536", "invalid port"),
        ("host:-1", "invalid port"),
        ("ftp://host:21", "unsupported scheme 'ftp'"),
        ("ws://host:80", "unsupported scheme 'ws'"),
        ("user:pw@host:80", "credentials"),
        ("http://user@host:80", "credentials"),
        ("host:80?x=1", "query"),
        ("http://host:80/p?x=1", "query"),
        ("host:80#frag", "fragment"),
        (":80", "no host"),
        ("http://:80", "no host"),
    ],
)
def test_parse_endpoint_errors(text: str, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        parse_endpoint(text)


@pytest.mark.parametrize(
    ("text", "loopback", "unspecified"),
    [
        ("localhost:1", True, False),
        ("LOCALHOST:1", True, False),
        ("localhost.localdomain:1", True, False),
        ("ip6-localhost:1", True, False),
        ("foo.localhost:1", True, False),
        ("a.b.localhost:1", True, False),
        ("127.0.0.1:1", True, False),
        ("127.0.0.5:1", True, False),
        ("127.255.255.254:1", True, False),
        ("[::1]:1", True, False),
        ("http://[::1]:1/x", True, False),
        ("0.0.0.0:1", False, True),
        ("[::]:1", False, True),
        ("10.0.0.5:1", False, False),
        ("128.0.0.1:1", False, False),
        ("[2001:db8::1]:1", False, False),
        ("agent.example:1", False, False),
        ("localhost.example:1", False, False),
        ("notlocalhost:1", False, False),
    ],
)
def test_loopback_and_unspecified(text: str, loopback: bool, unspecified: bool) -> None:
    endpoint = parse_endpoint(text)
    assert endpoint.is_loopback is loopback
    assert endpoint.is_unspecified is unspecified


@pytest.mark.parametrize(
    "text",
    [
        "[::ffff:127.0.0.1]:1",  # IPv4-mapped IPv6
        "127.1:1",  # inet_aton short form
        "2130706433:1",  # inet_aton single integer
        "localhost.:1",  # fully qualified with the root dot
    ],
)
def test_other_loopback_spellings(text: str) -> None:
    assert parse_endpoint(text).is_loopback


def test_endpoint_is_frozen() -> None:
    endpoint = parse_endpoint("h:1")
    with pytest.raises(AttributeError):
        endpoint.port = 2  # type: ignore[misc]
