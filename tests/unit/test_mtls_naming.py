"""The L1 naming rules: which DNS name and URIs say who is at each end of a TLS link."""

from __future__ import annotations

import hashlib
import re

import pytest

from reach.core.security.trust import HUB_URI, agent_uri, identity_name, mtls_refusal
from reach.sdk.tls import hub_peer_refusal

_LABEL = re.compile(r"^[0-9a-f]{32}$")


@pytest.mark.parametrize(
    "agent_id", ["planner", "doc-analyzer-01", "payments:eu.v2", "A", "x" * 128, "a_b.c-d:e"]
)
def test_identity_name_is_a_valid_dns_name_made_of_the_id_digest(agent_id: str) -> None:
    name = identity_name(agent_id)
    label, domain = name.split(".", 1)
    assert domain == "agent.reach"
    assert _LABEL.match(label), name  # one lowercase hex label: valid whatever the ID holds
    assert label == hashlib.sha256(agent_id.encode()).hexdigest()[:32]
    assert identity_name(agent_id) == name  # stable: the hub and `reach certs issue` agree


def test_identity_names_differ_between_agents_and_by_case() -> None:
    ids = ["planner", "Planner", "planner ", "planner2", "payments", "payment"]
    assert len({identity_name(i) for i in ids}) == len(ids)


def test_the_uris_name_the_hub_and_the_agent() -> None:
    assert HUB_URI == "urn:agent-reach:hub"
    assert agent_uri("payments") == "urn:agent-reach:agent:payments"
    assert agent_uri("hub") != HUB_URI  # an agent named "hub" is still not the hub


@pytest.mark.parametrize(
    ("url", "refused"),
    [
        ("https://10.0.0.5:7001/tasks/x", False),
        ("HTTPS://agent.example:443/tasks/x", False),
        ("http://10.0.0.5:7001/tasks/x", True),
        ("10.0.0.5:7001/tasks/x", True),
        ("ftp://agent.example:21/tasks/x", True),
        ("", True),
    ],
)
def test_an_l1_agent_is_reached_over_https_only(url: str, refused: bool) -> None:
    reason = mtls_refusal(url)
    assert (reason is not None) is refused
    if reason is not None:
        assert "L1 agent requires https + mTLS" in reason


@pytest.mark.parametrize(
    ("peer", "ok"),
    [
        ({"subjectAltName": (("URI", "urn:agent-reach:hub"),)}, True),
        ({"subjectAltName": (("DNS", "hub.example"), ("URI", "urn:agent-reach:hub"))}, True),
        ({"subjectAltName": (("URI", "urn:agent-reach:agent:planner"),)}, False),
        ({"subjectAltName": (("DNS", "urn:agent-reach:hub"),)}, False),  # a DNS entry is not it
        ({"subject": ((("commonName", "urn:agent-reach:hub"),),)}, False),  # nor the CN
        ({}, False),
        (None, False),
    ],
)
def test_an_l1_agent_serves_only_a_peer_whose_certificate_names_the_hub(
    peer: dict[str, object] | None, ok: bool
) -> None:
    assert (hub_peer_refusal(peer) is None) is ok
