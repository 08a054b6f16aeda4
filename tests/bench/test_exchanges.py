"""bench.exchanges' arithmetic and table: which options run, a client's figures, and
how a skipped option reads (the measurement itself is `python -m bench.exchanges`)."""

from __future__ import annotations

from typing import Any

import pytest

from bench import exchanges


@pytest.mark.parametrize("gevent", [True, False])
def test_every_option_runs_at_every_delay_then_the_sequential_ones(gevent: bool) -> None:
    steps = exchanges.plan([1.0, 0.0], gevent)
    options = ["aiohttp", "httpx", "threads", *(["gevent"] if gevent else [])]
    assert steps == [
        *((o, 1.0, False) for o in options),
        *((o, 0.0, False) for o in options),
        ("aiohttp", 0.0, True),
        ("requests", 0.0, True),
    ]


def test_a_clients_cpu_is_per_exchange_attempted() -> None:
    got = exchanges.row([True] * 1998 + [False] * 2, wall_s=1.8, cpu_s=0.78, maxrss_kb=66_560)
    assert got == {
        "exchanges": 2000, "ok": 1998, "wall_s": 1.8, "cpu_ms_per_exchange": 0.39,
        "peak_rss_mb": 65.0,
    }  # fmt: skip
    assert exchanges.row([], 0.0, 0.0, 0)["cpu_ms_per_exchange"] is None


def test_the_table_shows_each_run_and_says_why_one_was_skipped() -> None:
    def r(wall: float, cpu: float) -> dict[str, Any]:
        return exchanges.row([True] * 2000, wall, cpu, 66_560)

    result = {
        "concurrent": {
            "1": {"aiohttp": r(1.8, 0.78), "gevent": {"skipped": exchanges.GEVENT_BY_HAND}},
            "0": {"httpx": {"error": "Traceback ... ConnectError"}},
        },
        "sequential": {"requests": exchanges.row([True] * 500, 0.4, 0.245, 30_000)},
    }
    text = exchanges.table(result)
    assert "| aiohttp | 1 | 2000 | 2000 of 2000 | 1.80 | 0.39 | 65 |" in text
    assert "| gevent | 1 | - | skipped | - | - | - |" in text
    assert "| httpx | 0 | - | failed | - | - | - |" in text
    assert "| requests | 0 | 1 (sequential) | 500 of 500 | 0.40 | 0.49 | 29 |" in text
    assert "gevent: gevent is not importable in this Python" in text
    assert "0.69 ms CPU per exchange" in text
    assert "httpx: failed: Traceback ... ConnectError" in text


def test_a_delivery_is_json_the_size_of_a_hubs() -> None:
    import json

    body = json.dumps(exchanges.delivery(7))
    assert '"task_id": "x-7"' in body and 60 < len(body) < 200


def test_the_table_says_what_failed_exchanges_ran_into() -> None:
    failed = {
        **exchanges.row([True] * 1996 + [False] * 4, 37.9, 22.5, 63_000),
        "failures": {"ReadError: ": 3, "ConnectTimeout: ": 1},
    }
    text = exchanges.table({"concurrent": {"1": {"httpx": failed}}, "sequential": {}})
    assert "| httpx | 1 | 2000 | 1996 of 2000 |" in text
    assert "httpx (D = 1 s, 2000 at once): failed: ReadError (3); ConnectTimeout (1)" in text
