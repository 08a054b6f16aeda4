"""Semantic capability matching in the API: an intent (words) to ranked capabilities.

Rule-based routing stays first: the candidates are the instances the hard filters let
through (`reach.hub.fleet.registry.load_offers`, the rule routing uses), and only their agents'
declared capabilities are compared with the intent. The decisions (threshold, margin,
ranking with ReachScore and load, the random pick) are `reach.core.fleet.matching`'s.

Where the vectors come from, cheapest first:

1. this process's cache, by the digest of the model and the capability's texts;
2. the database (``agent_capabilities.embedding``), written once per declaration -- right
   after a registration, by this process's embedding thread, so every API replica has
   them and no message pays for them;
3. the model, for a capability whose stored vectors are missing or stale (registered
   while semantic matching was off, or before a model change); they are stored in turn.

An intent's own vector is computed once per distinct text (a bounded cache). Only the
API loads the model, lazily, on the first registration or intent that needs it; workers
and beat never do (a task's route is settled at submit time: the matched agent and
capability are written into its target).
"""

from __future__ import annotations

import logging
import queue
import random
import threading
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from cachetools import LRUCache
from sqlalchemy import select, update
from sqlalchemy.orm import Session

from reach.core.fleet import matching
from reach.core.fleet.matching import Proposal
from reach.core.fleet.routing import Candidate, RouteFilter
from reach.hub.fleet import registry
from reach.hub.fleet.embeddings.backend import (
    Availability,
    EmbeddingBackend,
    LazyBackend,
    SemanticMode,
    availability,
)
from reach.hub.fleet.embeddings.backends.minilm import MiniLMInt8
from reach.hub.fleet.reachability import Policy
from reach.hub.storage.models import AgentCapabilityRow, AgentRow

if TYPE_CHECKING:
    from reach.hub.fleet.embeddings.backend import Vectors

log = logging.getLogger("reach.hub.fleet.matching")

T = TypeVar("T")
Writer = Callable[[Callable[[Session], T]], T]

VECTOR_CACHE = 4096  # capabilities (digests) kept in memory, ~2 KB per text
INTENT_CACHE = 2048  # distinct intents kept with their vectors


@dataclass(frozen=True, slots=True)
class _Offer:
    """A capability an intent may be matched against, with the texts it is matched by."""

    agent_id: str
    capability: str
    texts: tuple[str, ...]
    digest: str


class Matcher:
    """This process's semantic matching: availability, the lazy model and the caches."""

    def __init__(
        self,
        mode: SemanticMode,
        threshold: float,
        margin: float,
        write: Writer[Any],
        policy: Policy,
        *,
        backend: type[EmbeddingBackend] = MiniLMInt8,
        rng: random.Random | None = None,
        model: str | None = None,
    ) -> None:
        self.availability: Availability = availability(mode, model)
        self.threshold = threshold
        self.margin = margin
        self._write = write
        self._policy = policy
        self._rng = rng or random.Random()
        self._kind = backend
        self._backend = LazyBackend(backend)
        self._model: str | None = None
        self._vectors: LRUCache[str, Vectors] = LRUCache(maxsize=VECTOR_CACHE)
        self._intents: LRUCache[str, Vectors] = LRUCache(maxsize=INTENT_CACHE)
        self._lock = threading.Lock()  # an LRU read reorders: not safe across threads
        self._jobs: queue.SimpleQueue[str] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    @property
    def on(self) -> bool:
        return self.availability.on

    def require(self) -> None:
        """Raise `SemanticMatchingOff` (with the reason) when matching is off here."""
        if not self.availability.on:
            raise self.availability.refusal()

    @property
    def model(self) -> str:
        if self._model is None:
            self._model = self._kind.model_name()
        return self._model

    # -- matching -------------------------------------------------------------------

    def proposals(
        self,
        session: Session,
        flt: RouteFilter,
        method: str | None,
        now: float,
        exclude: Collection[str] = (),
    ) -> list[Proposal]:
        """Every capability the hard filters allow, with its similarity to ``flt.intent``
        and its agent's standing (unranked). Agents in ``exclude`` (the reach's own path:
        a handler asking in words is never matched to itself or its callers) are left out."""
        self.require()
        intent = (flt.intent or "").strip()
        instances: dict[str, list[Candidate]] = {}
        declared: dict[str, list[dict[str, Any]]] = {}
        for candidate, capabilities in registry.load_offers(session, flt, now, self._policy):
            if candidate.agent_id in exclude:
                continue
            instances.setdefault(candidate.agent_id, []).append(candidate)
            declared[candidate.agent_id] = capabilities
        offers: list[_Offer] = []
        for agent_id, found in instances.items():
            by_type = {c["type"]: c for c in declared[agent_id]}
            for capability in matching.intent_capabilities(found[0], flt, method):
                texts = matching.texts_for(by_type[capability])
                digest = matching.texts_digest(self.model, texts)
                offers.append(_Offer(agent_id, capability, texts, digest))
        if not offers:
            return []
        vectors = self._offer_vectors(session, offers)
        query = self._intent_vector(intent)
        standing = {a: matching.standing_of(found) for a, found in instances.items()}
        return [
            Proposal(
                agent_id=o.agent_id,
                capability=o.capability,
                similarity=float((vectors[o.digest] @ query).max()),
                standing=standing[o.agent_id],
            )
            for o in offers
        ]

    def match(
        self, session: Session, flt: RouteFilter, method: str | None, now: float
    ) -> list[Proposal]:
        """The proposals at or above the threshold, best first; `NoSuitableAgent` with
        the closest ones and their scores when there is none."""
        found = self.proposals(session, flt, method, now)
        return matching.rank(found, self.threshold, self.margin, intent=flt.intent or "")

    def resolve(
        self,
        session: Session,
        flt: RouteFilter,
        method: str | None,
        now: float,
        exclude: Collection[str] = (),
    ) -> tuple[Proposal, list[Proposal]]:
        """The proposal a send takes, and the ranked proposals it was taken from."""
        found = self.proposals(session, flt, method, now, exclude)
        intent = flt.intent or ""
        ranked = matching.rank(found, self.threshold, self.margin, intent=intent)
        with self._lock:  # random.Random is not meant to be shared across threads unlocked
            chosen = matching.choose(ranked, self._rng, self.threshold, self.margin, intent=intent)
        return chosen, ranked

    # -- vectors --------------------------------------------------------------------

    def _embed(self, texts: Sequence[str]) -> Vectors:
        return self._backend.get().embed(texts)

    def _intent_vector(self, intent: str) -> Vectors:
        with self._lock:
            hit = self._intents.get(intent)
        if hit is not None:
            return hit
        vector: Vectors = self._embed([intent])[0]
        with self._lock:
            self._intents[intent] = vector
        return vector

    def _offer_vectors(self, session: Session, offers: Sequence[_Offer]) -> dict[str, Vectors]:
        import numpy as np

        found: dict[str, Vectors] = {}
        with self._lock:
            for o in offers:
                hit = self._vectors.get(o.digest)
                if hit is not None:
                    found[o.digest] = hit
        missing = [o for o in offers if o.digest not in found]
        if missing:
            rows = session.execute(
                select(AgentCapabilityRow.embedding_digest, AgentCapabilityRow.embedding)
                .where(AgentCapabilityRow.agent_id.in_({o.agent_id for o in missing}))
                .where(AgentCapabilityRow.embedding_digest.in_({o.digest for o in missing}))
            ).all()
            width = self._kind.dimension
            for digest, blob in rows:
                if digest is not None and blob and len(blob) % (4 * width) == 0:
                    found[digest] = np.frombuffer(blob, dtype="<f4").reshape(-1, width)
            absent = [o for o in missing if o.digest not in found]
            if absent:  # registered while matching was off, or under another model
                found.update(self._embed_offers(absent))
                log.info(
                    "semantic matching: embedded %d capabilities absent from the store",
                    len({o.digest for o in absent}),
                )
                for agent_id in {o.agent_id for o in absent}:
                    self._schedule(agent_id)  # stored by the embedding thread
            with self._lock:
                for o in missing:
                    self._vectors[o.digest] = found[o.digest]
        return found

    # -- registration -----------------------------------------------------------------

    def registered(self, agent_id: str, declares_capabilities: bool) -> None:
        """After a registration committed: have the agent's capability vectors computed
        and stored (by the embedding thread: the registration does not wait for the
        model). A no-op when semantic matching is off or nothing is declared."""
        if self.availability.on and declares_capabilities:
            self._schedule(agent_id)

    def _schedule(self, agent_id: str) -> None:
        self._jobs.put(agent_id)
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="reach-embeddings", daemon=True
                )
                self._thread.start()

    def _run(self) -> None:
        while True:
            agent_id = self._jobs.get()
            try:
                self.store_agent(agent_id)
            except Exception:  # logged, never fatal: a match computes what is missing
                log.exception("semantic matching: storing the vectors of %s failed", agent_id)

    def store_agent(self, agent_id: str) -> int:
        """Compute and store the vectors of ``agent_id``'s capabilities whose stored
        digest is stale; returns how many were written. A declaration that changed
        meanwhile is left alone (each write names the digest it replaces)."""
        offers = self._write(lambda session: self._stored(session, agent_id))
        stale = [(o, old) for o, old in offers if old != o.digest]
        if not stale:
            return 0
        with self._lock:
            vectors = {o.digest: self._vectors.get(o.digest) for o, _ in stale}
        todo = [o for o, _ in stale if vectors[o.digest] is None]
        made = self._embed_offers(todo) if todo else {}
        ready = {d: v for d, v in vectors.items() if v is not None} | made
        with self._lock:
            for digest, v in ready.items():
                self._vectors[digest] = v

        def write(session: Session) -> int:
            written = 0
            for o, old in stale:
                same = (
                    AgentCapabilityRow.embedding_digest.is_(None)
                    if old is None
                    else AgentCapabilityRow.embedding_digest == old
                )
                result = session.execute(
                    update(AgentCapabilityRow)
                    .where(AgentCapabilityRow.agent_id == o.agent_id)
                    .where(AgentCapabilityRow.capability == o.capability)
                    .where(same)
                    .values(
                        embedding_digest=o.digest,
                        embedding=ready[o.digest].astype("<f4").tobytes(),
                    )
                )
                written += int(getattr(result, "rowcount", 0) or 0)
            return written

        return int(self._write(write))

    def _stored(self, session: Session, agent_id: str) -> list[tuple[_Offer, str | None]]:
        """The agent's declared capabilities with the digest their stored vectors have."""
        declared = session.scalar(
            select(AgentRow.capabilities).where(AgentRow.agent_id == agent_id)
        )
        stored = dict(
            session.execute(
                select(AgentCapabilityRow.capability, AgentCapabilityRow.embedding_digest).where(
                    AgentCapabilityRow.agent_id == agent_id
                )
            ).all()
        )
        out = []
        for cap in declared or ():
            if cap["type"] in stored:
                texts = matching.texts_for(cap)
                digest = matching.texts_digest(self.model, texts)
                out.append((_Offer(agent_id, cap["type"], texts, digest), stored[cap["type"]]))
        return out

    def _embed_offers(self, offers: Iterable[_Offer]) -> dict[str, Vectors]:
        unique = {o.digest: o for o in offers}
        texts = [t for o in unique.values() for t in o.texts]
        matrix = self._embed(texts)
        out: dict[str, Vectors] = {}
        start = 0
        for digest, o in unique.items():
            out[digest] = matrix[start : start + len(o.texts)]
            start += len(o.texts)
        return out
