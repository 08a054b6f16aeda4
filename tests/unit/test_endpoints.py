"""Tables for agent address parsing and the loopback / unspecified classification."""

from __future__ import annotations

import pytest

from reach.core.fleet.endpoints import Endpoint, inet_aton, parse_endpoint, refusal
from reach.errors import InvalidRegistration, LoopbackAddress, RegistryError


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


# -- inet_aton: the pure parser reads what C's inet_aton reads --------------------------------

INET_ATON_FORMS = [
    # four parts, each one byte
    "127.0.0.1",
    "0.0.0.0",
    "255.255.255.255",
    "256.0.0.1",
    "1.2.3.256",
    "010.0.0.1",  # octal part: 8
    "0x7f.0.0.1",
    "0X7F.0.0.1",
    "0x7F.0xff.00.01",
    "08.0.0.1",  # 8 is not an octal digit
    "09.1.1.1",
    "0xg.0.0.1",
    "0x.0.0.1",  # hex prefix without digits
    "00000000000000000000127.0.0.1",  # leading zeros: octal 127 = 87
    "0x0000000000000000007f.0.0.1",
    # three parts: the last fills 16 bits
    "127.0.1",
    "127.0.65535",
    "127.0.65536",
    "127.0.0xffff",
    "127.256.1",
    # two parts: the last fills 24 bits
    "127.1",
    "127.16777215",
    "127.16777216",
    "0x7f.1",
    "0177.1",
    "1.0xffffff",
    # one part: all 32 bits
    "2130706433",
    "0",
    "4294967295",
    "4294967296",
    "0x7f000001",
    "0xffffffff",
    "0x100000000",
    "017700000001",
    "037777777777",
    "040000000000",
    "99999999999999999999999",
    # not addresses at all
    "",
    ".",
    "1.",
    ".1",
    "1..1",
    "1.2.3.4.5",
    "1.2.3.4.",
    "-1",
    "+1",
    "1e3",
    "a.b.c.d",
    "abc",
    "x1",
    "0x",
    "1.2.3.0x",
]


@pytest.mark.parametrize("text", INET_ATON_FORMS)
def test_inet_aton_matches_the_c_library(text: str) -> None:
    import socket  # unit tests may; reach.core may not (an import contract)

    try:
        expected: int | None = int.from_bytes(socket.inet_aton(text), "big")
    except OSError:
        expected = None
    assert inet_aton(text) == expected


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("127.1", 0x7F000001),
        ("0x7f.1", 0x7F000001),
        ("0177.0.0.1", 0x7F000001),
        ("2130706433", 0x7F000001),
        ("10.1.2", 0x0A010002),
        ("1.2.3.4", 0x01020304),
        ("08", None),
        ("1.2.3.4.5", None),
    ],
)
def test_inet_aton_values(text: str, value: int | None) -> None:
    assert inet_aton(text) == value


# -- the loopback rule, shared by the SDK and the registry -------------------------------------


@pytest.mark.parametrize(
    ("addr", "public", "allow_loopback", "expected"),
    [
        ("10.0.0.5:1", None, False, None),
        ("agent.example:1", None, False, None),
        ("127.0.0.1:1", None, True, None),
        ("localhost:1", None, True, None),
        ("127.0.0.1:1", "10.0.0.5:1", False, None),  # bound on loopback behind a proxy
        ("127.0.0.1:1", None, False, (LoopbackAddress, "addr")),
        ("127.1:1", None, False, (LoopbackAddress, "addr")),
        ("[::1]:1", None, False, (LoopbackAddress, "addr")),
        ("[::ffff:127.0.0.1]:1", None, False, (LoopbackAddress, "addr")),
        ("api.localhost:1", None, False, (LoopbackAddress, "addr")),
        ("10.0.0.5:1", "127.0.0.1:1", False, (LoopbackAddress, "public_endpoint")),
        ("0.0.0.0:1", "localhost:1", False, (LoopbackAddress, "public_endpoint")),
        ("0.0.0.0:1", "10.0.0.5:1", False, None),  # bind everywhere, reached at the public one
        # Unspecified is never reachable, opt-in or not.
        ("0.0.0.0:1", None, False, (InvalidRegistration, "addr")),
        ("0.0.0.0:1", None, True, (InvalidRegistration, "addr")),
        ("[::]:1", None, True, (InvalidRegistration, "addr")),
        ("10.0.0.5:1", "0.0.0.0:1", False, (InvalidRegistration, "public_endpoint")),
    ],
)
def test_refusal(
    addr: str,
    public: str | None,
    allow_loopback: bool,
    expected: tuple[type[RegistryError], str] | None,
) -> None:
    refused = refusal(
        parse_endpoint(addr), parse_endpoint(public) if public else None, allow_loopback
    )
    if expected is None:
        assert refused is None
        return
    assert refused is not None
    kind, field = expected
    assert (refused.kind, refused.field) == (kind, field)
    error = refused.error()
    assert type(error) is kind
    assert error.extra == {"field": field}
    assert str(error) == refused.message
    if kind is LoopbackAddress:
        assert "loopback" in refused.message and "allow_loopback=True" in refused.message
    else:
        assert "public_endpoint" in refused.message
