"""The API process's record of failed authentications per client address
(`reach.core.security.lockout` decides; this keeps the times).

In memory, per API process: nothing is written for a failure (a table anyone could grow
at hundreds of rows a second is an attack of its own), and the record is bounded
(``max_clients`` addresses, the least recently seen forgotten first; at most
``max_failures`` times each). Replicas keep their own records, so behind N replicas an
address gets at most N times the allowance. Used only from the event loop: no lock.
"""

from __future__ import annotations

from collections import OrderedDict, deque

from reach.core.security.lockout import LockoutPolicy, client_key, locked_for
from reach.hub.settings import Settings

MAX_CLIENTS = 10_000


class AuthLockout:
    """Failed authentications by client address, and whether one is locked out."""

    def __init__(self, policy: LockoutPolicy, max_clients: int = MAX_CLIENTS) -> None:
        self.policy = policy
        self.max_clients = max_clients
        self._failures: OrderedDict[str, deque[float]] = OrderedDict()

    @classmethod
    def configured(cls, settings: Settings) -> AuthLockout:
        security = settings.security
        return cls(LockoutPolicy(security.auth_failures_max, security.auth_failures_window_s))

    def locked_for(self, host: str | None, now: float) -> float | None:
        """Seconds ``host`` must wait before its credentials are checked again, or None."""
        failures = self._failures.get(client_key(host))
        return locked_for(failures, now, self.policy) if failures else None

    def failed(self, host: str | None, now: float) -> None:
        """Record one failed authentication by ``host``."""
        key = client_key(host)
        failures = self._failures.get(key)
        if failures is None:
            failures = self._failures[key] = deque(maxlen=self.policy.max_failures)
            while len(self._failures) > self.max_clients:
                self._failures.popitem(last=False)
        else:
            self._failures.move_to_end(key)
        failures.append(now)
