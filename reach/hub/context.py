"""The hub's runtime context: settings, database, clock, policies and the dispatcher.

Built once per process (API, worker child) and passed explicitly; nothing here is global.
The dispatcher comes from a factory the process's composer passes in
(`reach.worker.context` builds it on Celery): the hub never imports the broker's client.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property
from typing import Self, TypeVar

from sqlalchemy import Engine
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.orm import Session, sessionmaker

from reach.errors import HubUnavailable, ReachError, RegistrationConflict
from reach.hub.blobs.backend import BlobBackend
from reach.hub.blobs.configured import backend_for
from reach.hub.blobs.links import KEY_PURPOSE, BlobLinks
from reach.hub.clock import Clock, SystemClock
from reach.hub.delivery.policy import DeliveryPolicy
from reach.hub.dispatch import Dispatcher, DispatcherFactory
from reach.hub.fleet import registry
from reach.hub.fleet.embeddings.backend import folder_problem
from reach.hub.fleet.embeddings.backends.minilm import MiniLM, MiniLMInt8, folder_model
from reach.hub.fleet.matching import Matcher
from reach.hub.fleet.reachability import Policy
from reach.hub.flow.shared_counts import SharedCounts
from reach.hub.gates.approvals import ApprovalPolicy
from reach.hub.ledger.tasks import Publish, mark_published, unmark_published
from reach.hub.ledger.wakeups import CompletionBus
from reach.hub.notify import approval_webhook, callbacks
from reach.hub.security.sealing import SealKey
from reach.hub.settings import Settings
from reach.hub.storage import create_engine_for, read_session_factory, session_factory

T = TypeVar("T")


@dataclass
class HubContext:
    """What a request handler may touch: settings, the database, the hub's clock and the
    dispatcher ``dispatcher_factory`` builds on first use."""

    settings: Settings
    engine: Engine
    clock: Clock = field(default_factory=SystemClock)
    dispatcher_factory: DispatcherFactory = field(kw_only=True)
    db: sessionmaker[Session] = field(init=False)
    read_db: sessionmaker[Session] = field(init=False)
    completions: CompletionBus = field(init=False)

    def __post_init__(self) -> None:
        self.db = session_factory(self.engine)
        self.read_db = read_session_factory(self.engine)
        broker = self.settings.storage.resolved_broker_url
        self.completions = CompletionBus(
            broker if broker.startswith(("redis://", "rediss://")) else None
        )
        self.completions.attach(self.db)
        if self.settings.approval.webhook_url:
            approval_webhook.attach(self.db, lambda a: self.dispatcher.publish_webhook(a))
        callbacks.attach(self.db, lambda c: self.dispatcher.send_callback(c))

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        clock: Clock | None = None,
        *,
        dispatcher_factory: DispatcherFactory,
    ) -> Self:
        storage = settings.storage
        engine = create_engine_for(
            storage.resolved_database_url,
            pool_size=storage.pool_size,
            max_overflow=storage.max_overflow,
        )
        return cls(
            settings=settings,
            engine=engine,
            clock=clock or SystemClock(),
            dispatcher_factory=dispatcher_factory,
        )

    @cached_property
    def policy(self) -> Policy:
        return Policy.from_settings(self.settings)

    @cached_property
    def registry_limits(self) -> registry.Limits:
        return registry.Limits.from_settings(self.settings)

    @cached_property
    def approval_policy(self) -> ApprovalPolicy:
        return ApprovalPolicy.from_settings(self.settings)

    @cached_property
    def seal(self) -> SealKey:
        """The seal key of secrets at rest and the dashboard's cookies
        (`reach.hub.security.sealing`):
        ``security.seal_key``, else ``<storage.home>/seal.key``."""
        configured = self.settings.security.seal_key
        secret = configured.get_secret_value() if configured is not None else None
        return SealKey.load(secret, self.settings.storage.home_path)

    @cached_property
    def delivery_policy(self) -> DeliveryPolicy:
        return dataclasses.replace(
            DeliveryPolicy.from_settings(self.settings), seal=self.seal, blob_links=self.blob_links
        )

    @cached_property
    def blob_store(self) -> BlobBackend:
        """Where payload blobs are kept (``blobs.store``, `reach.hub.blobs.backend`)."""
        return backend_for(self.settings.blobs, self.settings.storage.home_path)

    @cached_property
    def blob_links(self) -> BlobLinks:
        """The links agents read blobs with, signed with a key derived from the seal key."""
        blobs = self.settings.blobs
        return BlobLinks(
            self.seal.derive(KEY_PURPOSE), blobs.link_ttl_s, self.blob_store, blobs.public_url
        )

    @cached_property
    def matcher(self) -> Matcher:
        """Semantic capability matching (`reach.hub.fleet.matching`); the model loads on first
        use, so building this costs a look for the packages and nothing more."""
        router = self.settings.router
        backend: type[MiniLM] = MiniLMInt8 if router.semantic_quantize else MiniLM
        model = router.semantic_model
        if model is not None and router.semantic != "off" and not folder_problem(model):
            backend = folder_model(model, quantize=router.semantic_quantize)
        return Matcher(
            router.semantic,
            router.semantic_threshold,
            router.semantic_margin,
            self.write,
            self.policy,
            backend=backend,
            model=model if router.semantic != "off" else None,
        )

    @cached_property
    def shared_counts(self) -> SharedCounts:
        """This process's handle on the hub-wide flow windows (retry budgets, breakers,
        agent pairs): built after fork, like the engine."""
        # half a second of lag: a herd of retries released at once by several
        # processes must see each other's counts before the budget is overspent
        return SharedCounts(self.db, read_db=self.read_db, flush_every=0.5, read_ttl=0.25)

    @cached_property
    def dispatcher(self) -> Dispatcher:
        """This process's dispatcher, built on first use (after fork, like the engine)."""
        return self.dispatcher_factory(self.settings)

    def publish_attempts(self, items: list[Publish]) -> int:
        """Publish and mark each attempt; one the broker refuses stays for the relay."""
        done = 0
        for item in items:
            if self.dispatcher.publish(item):
                with self.transaction() as session:
                    mark_published(session, item.task_id, item.attempt_seq, self.clock.now())
                done += 1
        return done

    def publish_premarked(self, item: Publish) -> bool:
        """Publish an attempt already marked published at commit; un-mark it if the broker
        refuses, so the relay takes it (its grace) instead of the overdue net (longer)."""
        if self.dispatcher.publish(item):
            return True
        with self.transaction() as session:
            unmark_published(session, item.task_id, item.attempt_seq)
        return False

    @contextmanager
    def transaction(self) -> Iterator[Session]:
        """One transaction; database outages surface as a 503 problem, not a 500."""
        try:
            with self.db.begin() as session:
                yield session
        except OperationalError as exc:
            raise HubUnavailable(f"the hub's database is unavailable: {exc.orig}") from exc

    @contextmanager
    def reading(self) -> Iterator[Session]:
        """A transaction that only reads: it never takes SQLite's write lock."""
        try:
            with self.read_db.begin() as session:
                yield session
        except OperationalError as exc:
            raise HubUnavailable(f"the hub's database is unavailable: {exc.orig}") from exc

    def write(
        self,
        work: Callable[[Session], T],
        *,
        conflict: type[ReachError] = RegistrationConflict,
    ) -> T:
        """Run ``work`` in a transaction; retry once if a concurrent writer won a unique race.

        A race lost twice raises ``conflict``: the caller names the error type of the
        resource it writes (``TaskConflict`` for tasks, ``DagError`` for DAG runs ...),
        so a caller never sees a registry error for a task."""
        for attempt in (1, 2):
            try:
                with self.transaction() as session:
                    return work(session)
            except IntegrityError as exc:
                if attempt == 2:
                    raise conflict(
                        "a concurrent request changed the same record; retry", cause=str(exc.orig)
                    ) from exc
        raise AssertionError("unreachable")
