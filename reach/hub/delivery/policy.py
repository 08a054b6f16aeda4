"""The delivery's settings, resolved once per process: retries, timeouts, leases, the
breaker, tokens, budgets and priority."""

from __future__ import annotations

from dataclasses import dataclass, field

from reach.core.delivery.retry import RetryPolicy
from reach.core.flow.breakers import BreakerPolicy
from reach.core.flow.priority import PriorityPolicy
from reach.core.flow.retry_budget import RetryBudget
from reach.hub.blobs.links import BlobLinks
from reach.hub.security.sealing import SealKey
from reach.hub.settings import Settings
from reach.hub.storage.models import TaskRow


@dataclass(frozen=True, slots=True)
class DeliveryPolicy:
    retry: RetryPolicy
    connect_timeout: float
    read_timeout: float | None = None  # a cap on one exchange; None: the task's timeout_ms
    lease_margin: float = 10.0
    lease_s: float = 15.0  # an exchange's lease, renewed while it lasts (``exchanger``)
    watchdog_grace: float = 30.0
    republish_grace: float = 10.0
    max_redeliveries: int = 5
    max_deferrals: int = 50
    republish_backlog: int = 10  # queue deeper than this: overdue attempts are queued, not lost
    breaker: BreakerPolicy = field(default_factory=BreakerPolicy)
    sign_deliveries: bool = True  # a hub-signed reach token on every delivery
    issuer: str = "agent-reach"  # the tokens' ``iss``
    token_ttl_s: float = 300.0  # the tokens' lifetime (capped at 15 min)
    l3_max_payload_bytes: int = 65_536  # the payload cap of reaches to or from an L3 agent
    retry_budget: RetryBudget = field(default_factory=RetryBudget)  # re-sends per target
    priority: PriorityPolicy = field(default_factory=PriorityPolicy)  # background yields
    approval_patterns: tuple[str, ...] = ()  # approval.capabilities: gated whoever declares
    seal: SealKey | None = None  # opens the signing key (reach.hub.security.sealing): HubContext's
    blob_links: BlobLinks | None = None  # a task's payload_ref link (reach.hub.blobs): HubContext's

    @classmethod
    def from_settings(cls, settings: Settings) -> DeliveryPolicy:
        r = settings.router
        return cls(
            retry=RetryPolicy(max_retry=r.max_retry, base=r.backoff_base, cap=r.backoff_cap),
            connect_timeout=r.connect_timeout,
            read_timeout=r.read_timeout,
            lease_s=settings.exchanges.lease_s,
            watchdog_grace=r.watchdog_grace,
            republish_grace=r.republish_grace,
            breaker=BreakerPolicy(
                window_s=r.breaker_window,
                failure_ratio=r.breaker_failure_ratio,
                min_volume=r.breaker_min_volume,
                trial_interval_s=r.breaker_trial_interval,
                streak=r.breaker_streak,
                recovery_windows=r.breaker_recovery_windows,
            ),
            sign_deliveries=settings.security.sign_deliveries,
            issuer=settings.security.issuer,
            token_ttl_s=settings.security.token_ttl_s,
            l3_max_payload_bytes=settings.security.l3_max_payload_bytes,
            retry_budget=RetryBudget(
                ratio=r.retry_budget_ratio,
                min_per_s=r.retry_budget_min_per_s,
                window_s=r.retry_budget_window,
            ),
            priority=PriorityPolicy(
                background_share=r.background_share,
                defer_s=r.background_defer_s,
                max_wait_s=r.background_max_wait_s,
            ),
            approval_patterns=tuple(settings.approval.capabilities),
        )

    def exchange_timeout_ms(self, timeout_ms: int) -> float:
        """How long one exchange may last: the task's timeout (an agent may think that
        long: no worker slot waits on it), or ``read_timeout`` if that is set and shorter."""
        cap = self.read_timeout if self.read_timeout is not None else float("inf")
        return max(0.05, min(cap, timeout_ms / 1000))

    def first_lease_s(self) -> float:
        """The longest lease a claim takes on top of its margin: an exchange shorter than
        ``lease_s`` is covered at once, a longer one is renewed while it lasts."""
        return min(self.read_timeout or self.lease_s, self.lease_s)

    def lease_for(self, task: TaskRow) -> float:
        """The lease a claim of ``task`` takes: connect + its exchange (up to ``lease_s``)
        + a margin."""
        exchange = min(self.exchange_timeout_ms(task.timeout_ms), self.lease_s)
        return self.connect_timeout + exchange + self.lease_margin

    def renewed_lease(self) -> float:
        """What a renewal grants from now: a whole ``lease_s`` and the margin."""
        return self.connect_timeout + self.lease_s + self.lease_margin
