"""The network rule (reach.core.security.networks): which addresses the hub will call."""

from __future__ import annotations

import ipaddress

import pytest

from reach.core.notify.callbacks import url_refusal
from reach.core.security.networks import NetworkRule, is_demo_hub, parse_networks

STRICT = NetworkRule()
DEMO = NetworkRule(loopback=True, private=True)
LOOPBACK_ONLY = NetworkRule(loopback=True)
DECLARED = NetworkRule(networks=parse_networks(["10.20.0.0/16", "fd00:1::/32"]))


@pytest.mark.parametrize(
    ("address", "rule", "refused"),
    [
        ("93.184.216.34", STRICT, None),
        ("2606:2800:220:1:248:1893:25c8:1946", STRICT, None),
        ("127.0.0.1", STRICT, "loopback"),
        ("127.5.6.7", STRICT, "loopback"),
        ("::1", STRICT, "loopback"),
        ("::ffff:127.0.0.1", STRICT, "loopback"),
        ("127.0.0.1", LOOPBACK_ONLY, None),
        ("127.0.0.1", DEMO, None),
        ("10.1.2.3", STRICT, "private"),
        ("10.1.2.3", LOOPBACK_ONLY, "private"),
        ("10.1.2.3", DEMO, None),
        ("10.20.3.4", DECLARED, None),
        ("10.21.3.4", DECLARED, "private"),
        ("fd00:1::5", DECLARED, None),
        ("fd00:2::5", DECLARED, "private"),
        ("192.168.1.1", STRICT, "private"),
        ("100.64.0.1", STRICT, "not a public"),  # shared (CGNAT): not private, not global
        ("192.0.0.8", STRICT, "not a public"),  # IETF assignment; global before 3.12.4
        ("240.0.0.1", STRICT, "private"),
        ("64:ff9b::7f00:1", STRICT, "not a public"),  # reserved
        ("2002:7f00:1::", STRICT, "6to4 of a loopback"),
        ("2002:7f00:1::", LOOPBACK_ONLY, None),
        # link-local (cloud metadata): never, whatever the rule
        ("169.254.169.254", STRICT, "link-local"),
        ("169.254.169.254", DEMO, "link-local"),
        ("::ffff:169.254.169.254", DEMO, "link-local"),
        ("fe80::1", DEMO, "link-local"),
        ("fe80::1%eth0", DEMO, "link-local"),
        ("0.0.0.0", DEMO, "unspecified"),
        ("::", DEMO, "unspecified"),
        ("224.0.0.1", DEMO, "multicast"),
        ("localhost", DEMO, "not an IP"),
    ],
)
def test_refusal(address: str, rule: NetworkRule, refused: str | None) -> None:
    reason = rule.refusal(address)
    assert (reason is None) == (refused is None), reason
    if refused:
        assert refused in str(reason)
        assert address.split("%")[0] not in str(reason)  # the kind, never the address


def test_one_refused_address_refuses_the_name() -> None:
    assert STRICT.first_refusal(["93.184.216.34", "10.0.0.1"]) is not None
    assert STRICT.first_refusal(["93.184.216.34"]) is None


@pytest.mark.parametrize(
    ("values", "error"),
    [
        (["10.0.0.0/8", "fd00::/8", "172.16.5.0/24"], None),
        (["10.0.0.1"], None),  # one host
        (["10.0.0.5/8"], None),  # host bits: the network meant
        (["nonsense"], "not a network"),
        (["169.254.0.0/16"], "link-local"),
        (["169.0.0.0/8"], "link-local"),  # overlaps it
        (["fe80::/64"], "link-local"),
        (["0.0.0.0/0"], "link-local"),
        (["127.0.0.0/8"], "allow_loopback_agents"),
    ],
)
def test_parse_networks(values: list[str], error: str | None) -> None:
    if error is None:
        assert all(isinstance(n, ipaddress.IPv4Network | ipaddress.IPv6Network)
                   for n in parse_networks(values))  # fmt: skip
    else:
        with pytest.raises(ValueError, match=error):
            parse_networks(values)


@pytest.mark.parametrize(
    ("require_auth", "host", "demo"),
    [
        (None, "127.0.0.1", True),  # reach up as shipped
        (None, "localhost", True),
        (None, "::1", True),
        (False, "127.0.0.1", True),
        (True, "127.0.0.1", False),  # auth on: not a demo
        (None, "0.0.0.0", False),  # auth turns on beyond loopback
        (False, "0.0.0.0", False),  # open beyond loopback: not a demo either
        (False, "10.0.0.5", False),
    ],
)
def test_demo_hub(require_auth: bool | None, host: str, demo: bool) -> None:
    assert is_demo_hub(require_auth, host) is demo


def test_callbacks_never_reach_link_local_even_when_private_is_allowed() -> None:
    def metadata(host: str, port: int) -> list[str]:
        return ["169.254.169.254"]

    assert "link-local" in str(url_refusal("http://cb.example/x", True, metadata))

    def shared(host: str, port: int) -> list[str]:
        return ["100.64.3.4"]

    assert "not a public" in str(url_refusal("http://cb.example/x", False, shared))
    assert url_refusal("http://cb.example/x", True, shared) is None
