"""Each pytest-xdist worker has a Redis database no bench hub uses.

The bench smoke test and the semantic stage start bench hubs on the shared Redis, and a
test worker on the same database number would share their broker: each hub's Celery worker
takes the other's tasks (a run with ``-n 3`` lost webhooks and bench tasks that way).
"""

from __future__ import annotations

import pytest

from bench.processes import CELERY_URL, MICRO_REDIS_URL, REDIS_URL
from tests.install.test_fresh_installs import INSTALL_REDIS_URL
from tests.support import stores


def _db(url: str) -> int:
    return int(url.rstrip("/").rsplit("/", 1)[1])


def test_no_worker_shares_a_database_with_a_bench_hub_or_the_install_checks() -> None:
    taken = {
        _db(REDIS_URL),  # the bench's hub (tests/bench, tests/semantic)
        _db(CELERY_URL),  # its plain Celery baseline
        _db(MICRO_REDIS_URL),  # bench.micro
        _db(INSTALL_REDIS_URL),  # tests/install
    }
    assert taken.isdisjoint(stores.WORKER_REDIS_DBS)
    assert len(set(stores.WORKER_REDIS_DBS)) == len(stores.WORKER_REDIS_DBS)
    assert all(0 < db < 16 for db in stores.WORKER_REDIS_DBS)  # 0: a user's default


@pytest.mark.parametrize(("worker", "db"), [("gw0", 14), ("gw1", 13), ("gw2", 9), ("gw10", 1)])
def test_each_worker_gets_its_own(monkeypatch: pytest.MonkeyPatch, worker: str, db: int) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
    assert stores.own_redis_url() == f"{stores.REDIS_URL}/{db}"


def test_a_worker_past_the_table_is_told_how_many_fit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw11")
    with pytest.raises(RuntimeError, match="at most -n 11"):
        stores.own_redis_url()
