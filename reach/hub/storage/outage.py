"""The storage edge for code that is not a request: SQLAlchemy's errors become `HubUnavailable`.

Request handlers go through ``HubContext.transaction``; deliveries and breaker writes run
in Celery tasks, where a raw ``OperationalError`` would reach Celery as a foreign crash.
Here a failed statement, a lost connection or an exhausted pool is one typed error the
task shell can retry on (the outbox's nets recover the attempt if it gives up).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy.exc import DBAPIError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from reach.errors import HubUnavailable


@contextmanager
def database_outage(what: str) -> Iterator[None]:
    """Raise `HubUnavailable` (naming ``what`` and the driver's error) for a database failure."""
    try:
        yield
    except DBAPIError as exc:
        raise HubUnavailable(
            f"{what}: the hub's database failed ({type(exc.orig).__name__}: {exc.orig})",
            cause=type(exc).__name__,
        ) from exc
    except PoolTimeout as exc:
        raise HubUnavailable(
            f"{what}: no database connection free in time ({exc})", cause="PoolTimeout"
        ) from exc
