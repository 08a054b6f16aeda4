"""A2A agents registered by their card, and the beat's re-reading of every card.

``POST /api/v1/agents/a2a`` (``reach agents add-a2a URL``) fetches the card, checks it
with ``a2a-sdk``'s own ``AgentCard`` type and then for what the hub needs
(``reach.core.interop.a2a.card_facts``), and registers an agent whose capabilities are the card's
skills, with one instance reached over A2A. Nothing changes in the A2A agent.

An A2A agent sends no heartbeats, so the hub reads its card again every
``a2a.card_refresh_s`` (the instance's heartbeat interval): a good read stamps the
heartbeat with the hub's clock and takes a changed card's skills, a failed one leaves
the instance to go offline after the usual missed intervals. Probes ask for the card too.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from typing import Annotated, Any
from urllib.parse import urlsplit

from pydantic import Field, ValidationError
from sqlalchemy import select
from sqlalchemy.orm import Session

from reach.core.fleet.endpoints import parse_endpoint, refusal
from reach.core.fleet.health import InstanceStatus
from reach.core.interop import a2a as rules
from reach.core.security.networks import NetworkRule
from reach.errors import (
    AddressRefused,
    AgentCardUnavailable,
    InvalidAgentCard,
    LoopbackAddress,
    ReachError,
)
from reach.hub.fleet import registry
from reach.hub.fleet.reachability import Policy
from reach.hub.interop.a2a import PROTOCOL
from reach.hub.interop.a2a.exchange import CREDENTIAL, open_credential
from reach.hub.security.networks import judge_host
from reach.hub.security.sealing import SealKey
from reach.hub.storage.models import AgentRow, InstanceEventRow, InstanceRow
from reach.wire.schemas import AgentId, RegisterRequest, WireModel

log = logging.getLogger("reach.hub.interop.a2a")

MAX_CARD_BYTES = 262_144


class A2aRegistration(WireModel):
    """``POST /api/v1/agents/a2a``: register the A2A agent whose card is at ``card_url``
    (its base URL, or the card's own URL)."""

    card_url: str = Field(min_length=1, max_length=512)
    agent_id: AgentId | None = Field(None, description="default: from the card's name")
    credential: Annotated[str, Field(min_length=1, max_length=4096)] | None = Field(
        None, description="the secret for the card's security scheme (bearer or API key)"
    )
    allow_loopback: bool = False
    max_concurrency: int = Field(8, ge=1, le=100_000)


@dataclass(frozen=True, slots=True)
class FetchedCard:
    url: str  # where the card was read
    card: dict[str, Any]  # its canonical JSON (a2a-sdk's AgentCard, printed)
    facts: rules.CardFacts
    etag: str | None = None


def instance_id_of(card_url: str) -> str:
    """One instance per card: registering the same card again refreshes it."""
    return "a2a-" + hashlib.sha256(card_url.encode()).hexdigest()[:24]


def _check_address(url: str, allow_loopback: bool, what: str, rule: NetworkRule) -> None:
    try:
        endpoint = parse_endpoint(f"{urlsplit(url).scheme}://{urlsplit(url).netloc}")
    except ValueError as exc:
        raise InvalidAgentCard(f"{what} {url!r} is not a usable address: {exc}") from None
    refused = refusal(endpoint, None, allow_loopback)
    if refused is not None:
        raise refused.error()
    try:
        _addresses, why = judge_host(endpoint.host, endpoint.port, rule)
    except OSError as exc:
        raise AgentCardUnavailable(
            f"{what} {endpoint.host!r} does not resolve ({type(exc).__name__})", card_url=url
        ) from None
    if why == "a loopback address":
        raise LoopbackAddress(
            f"{what} resolves to a loopback address: this hub calls loopback agents only as "
            "a local demo or with security.allow_loopback_agents",
            field="card_url",
        )
    if why is not None:
        raise AddressRefused(
            f"{what} resolves to {why} (security.agent_networks declares the private "
            "networks the hub calls)",
            field="card_url",
        )


def fetch_card(url: str, timeout: float, *, allow_loopback: bool, rule: NetworkRule) -> FetchedCard:
    """Read and check the card at ``url``; `AgentCardUnavailable` when it cannot be read,
    `InvalidAgentCard` when it is not a card the hub can reach an agent by. Its address,
    and that of the JSON-RPC URL it names, must be ones ``rule`` lets the hub call; a
    redirect is not followed (it is an answer other than the card)."""
    card_url = rules.card_url_of(url)
    if urlsplit(card_url).scheme not in ("http", "https"):
        raise InvalidAgentCard(f"card URL {card_url!r} is not http(s)")
    _check_address(card_url, allow_loopback, "card URL", rule)
    import requests  # on first use: a worker that never reads a card does without it

    try:
        with requests.Session() as http:
            http.trust_env = False
            resp = http.get(
                card_url,
                timeout=timeout,
                headers={"Accept": "application/json"},
                allow_redirects=False,
            )
            raw = resp.content[: MAX_CARD_BYTES + 1]
    except requests.RequestException as exc:
        raise AgentCardUnavailable(
            f"could not read the agent card at {card_url}: {type(exc).__name__}",
            card_url=card_url,
        ) from None
    if resp.status_code != 200:
        raise AgentCardUnavailable(
            f"the agent card at {card_url} answered HTTP {resp.status_code}", card_url=card_url
        )
    if len(raw) > MAX_CARD_BYTES:
        raise InvalidAgentCard(f"the agent card at {card_url} is larger than {MAX_CARD_BYTES} B")
    try:
        body = resp.json()
    except ValueError:
        raise AgentCardUnavailable(
            f"the agent card at {card_url} is not JSON", card_url=card_url
        ) from None
    if not isinstance(body, dict):
        raise InvalidAgentCard(f"the agent card at {card_url} is not a JSON object")
    # a2a-sdk on first use: an API process that never reads a card never loads it
    from a2a.types import AgentCard
    from google.protobuf.json_format import MessageToDict, ParseDict, ParseError

    try:
        parsed = ParseDict(body, AgentCard(), ignore_unknown_fields=True)
    except ParseError as exc:
        raise InvalidAgentCard(f"not an A2A agent card ({card_url}): {exc}") from None
    card = MessageToDict(parsed)
    try:
        facts = rules.card_facts(card)
    except ValueError as exc:
        raise InvalidAgentCard(f"agent card at {card_url}: {exc}", card_url=card_url) from None
    _check_address(facts.rpc_url, allow_loopback, "the card's JSON-RPC URL", rule)
    return FetchedCard(card_url, card, facts, resp.headers.get("ETag"))


def register_card(
    session: Session,
    fetched: FetchedCard,
    *,
    agent_id: str | None,
    credential: str | None,
    allow_loopback: bool,
    max_concurrency: int,
    now: float,
    policy: Policy,
    refresh_s: float,
    seal: SealKey | None = None,
    network: NetworkRule | None = None,
    refresh: bool = False,
) -> dict[str, Any]:
    """Register (or refresh) the card's agent and its one A2A instance; its view
    (``network``: the rule its address is judged by; default the policy's). The
    credential is stored sealed with ``seal`` (``reach.hub.security.sealing``).

    A credential is bound to the origin of the JSON-RPC URL the card named when it was
    given: a card that names another origin later (``refresh``: the beat's re-read; or
    an admin's registration without the credential) is refused, and the credential
    stays where it was given. Only an admin who gives the credential again moves it.

    A ``refresh`` (the beat reading the card again, no admin involved) may narrow what
    the agent declares but not widen it: a card that now names a skill or tag the agent
    was not registered with is refused (`InvalidAgentCard`, recorded as the card's error
    with an alert), and the registration stays as the admin made it until an admin
    registers the card again (issue 37: no squatting through a card's refresh)."""
    facts = fetched.facts
    if facts.scheme.kind != "none" and not credential:
        raise InvalidAgentCard(
            f"the card requires {facts.scheme.kind} authentication (scheme "
            f"{facts.scheme.name!r}): pass the credential to present",
            card_url=fetched.url,
        )
    instance_id = instance_id_of(fetched.url)
    origin = rules.origin_of(facts.rpc_url)
    bound = _credential_origin(session.get(InstanceRow, instance_id))
    if bound is not None and bound != origin and (refresh or not credential):
        raise InvalidAgentCard(
            f"the card now names its JSON-RPC at {origin}, and the credential the hub holds "
            f"for it is bound to {bound}: it does not follow the agent to another host. An "
            "admin who trusts the new host registers the card again with the credential",
            card_url=fetched.url,
        )
    try:
        req = RegisterRequest(
            agent_id=agent_id or rules.agent_id_of(facts.name),
            instance_id=instance_id,
            addr=facts.rpc_url,
            tags=facts.tags,
            capabilities=facts.capabilities,  # validated into Capability here
            metadata={"protocol": PROTOCOL},
            max_concurrency=max_concurrency,
            heartbeat_interval=refresh_s,
            allow_loopback=allow_loopback,
            version=facts.version,
        )
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise InvalidAgentCard(
            f"the card does not make a valid registration ({where}: {first['msg']})",
            card_url=fetched.url,
        ) from None
    if refresh:
        _check_no_new_declarations(session, req, fetched.url)
    answer = registry.register(session, req, now, policy, network=network)
    row = session.get(InstanceRow, instance_id, with_for_update=True)
    assert row is not None
    row.protocol = PROTOCOL
    row.a2a = {
        "card_url": fetched.url,
        "rpc_url": facts.rpc_url,
        "streaming": facts.streaming,
        "scheme": {"kind": facts.scheme.kind, "name": facts.scheme.name,
                   "header": facts.scheme.header},
        "name": facts.name,
        "skills": facts.skills,
        "read_at": now,
    }  # fmt: skip
    if credential:
        row.a2a_credential = (
            seal.seal(credential, purpose=CREDENTIAL, name=instance_id) if seal else credential
        )
    if row.a2a_credential:
        row.a2a = {**row.a2a, "credential_origin": origin}
    if not answer.created:
        row.heartbeat_count += 1  # a card read again: the heartbeat of an A2A instance
    session.flush()
    return {
        **answer.model_dump(),
        "card_url": fetched.url,
        "skills": [s["id"] for s in facts.skills],
    }


def _check_no_new_declarations(session: Session, req: RegisterRequest, card_url: str) -> None:
    agent = session.get(AgentRow, req.agent_id)
    if agent is None:
        return
    known = {c["type"] for c in agent.capabilities} | {f"tag:{t}" for t in agent.tags}
    now_declared = {c.type for c in req.capabilities} | {f"tag:{t}" for t in req.tags}
    added = sorted(now_declared - known)
    if added:
        raise InvalidAgentCard(
            f"the card now declares {', '.join(added)}, which its registration does not: "
            "not applied until an admin registers the card again (POST /api/v1/agents/a2a)",
            card_url=card_url,
        )


def _credential_origin(row: InstanceRow | None) -> str | None:
    """Where the credential ``row`` holds may be presented (None: it holds none)."""
    if row is None or not row.a2a_credential:
        return None
    a2a = row.a2a or {}
    bound = a2a.get("credential_origin")
    if bound:
        return str(bound)
    return rules.origin_of(str(a2a["rpc_url"])) if a2a.get("rpc_url") else None


def due_refreshes(
    session: Session, seal: SealKey | None = None
) -> list[tuple[str, str, str, str | None, bool, int]]:
    """Every A2A instance not deregistered: (instance, agent, card URL, credential
    (unsealed), allow_loopback, max_concurrency)."""
    rows = session.scalars(
        select(InstanceRow).where(
            InstanceRow.protocol == PROTOCOL,
            InstanceRow.status != InstanceStatus.DEREGISTERED.value,
        )
    ).all()
    return [
        (
            r.instance_id,
            r.agent_id,
            str((r.a2a or {}).get("card_url") or ""),
            open_credential(r, seal),
            r.allow_loopback,
            r.max_concurrency,
        )
        for r in rows
        if (r.a2a or {}).get("card_url")
    ]


def refresh_one(
    db: Any,
    item: tuple[str, str, str, str | None, bool, int],
    now: Any,
    policy: Policy,
    refresh_s: float,
    timeout: float,
    seal: SealKey | None = None,
) -> bool:
    """Read one card again: a good read re-registers (the heartbeat, and any change of
    skills); a failed one is recorded once, until the card reads again."""
    instance_id, agent_id, card_url, credential, allow_loopback, slots = item
    try:
        fetched = fetch_card(card_url, timeout, allow_loopback=allow_loopback, rule=policy.network)
        with db.begin() as session:
            register_card(
                session,
                fetched,
                agent_id=agent_id,
                credential=credential,
                allow_loopback=allow_loopback,
                max_concurrency=slots,
                now=now(),
                policy=policy,
                refresh_s=refresh_s,
                seal=seal,
                refresh=True,
            )
        return True
    except ReachError as exc:
        with db.begin() as session:
            row = session.get(InstanceRow, instance_id, with_for_update=True)
            if row is not None and (row.a2a or {}).get("card_error") != exc.detail:
                row.a2a = {**(row.a2a or {}), "card_error": exc.detail}
                session.add(
                    InstanceEventRow(
                        instance_id=instance_id,
                        agent_id=agent_id,
                        kind="alert",
                        detail={"alert": "a2a_card_unreadable", "reason": exc.detail},
                        at=now(),
                    )
                )
        log.warning("A2A card of %s/%s not refreshed: %s", agent_id, instance_id, exc.detail)
        return False
