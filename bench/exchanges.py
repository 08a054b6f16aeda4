"""``python -m bench.exchanges``: the HTTP stacks weighed for the exchange loop, again.

A worker process keeps up to 2,000 exchanges with agents in flight on one event loop
(``reach.hub.delivery.exchanger``), with aiohttp. This measures what the options cost on
this machine, each in a client process of its own (so one's imports, threads or memory
never weigh on another's figures), against a mock agent served by uvicorn (a raw ASGI app,
in a process of its own) that answers each POST after D seconds:

- ``aiohttp``: one ``ClientSession``, ``TCPConnector(limit=0)``, all POSTs gathered;
- ``httpx``: one ``AsyncClient`` with unbounded ``Limits``, all POSTs gathered;
- ``threads``: a ``requests.Session`` per thread, one thread per POST;
- ``gevent``: the same with gevent's monkey-patching, where gevent is importable (it is
  not a dependency: elsewhere it is reported as skipped).

Each with ``--concurrent`` POSTs (2,000) at once, for D = 1 s (exchanges held, as an agent
that thinks holds them) and D = 0 (the client's own cost per exchange); and
``--sequential`` POSTs one at a time for aiohttp and requests (D = 0). Reported per
option: wall time of the measured phase, CPU time per exchange (``getrusage`` of the
client process, user + system, over the measured phase: connecting included, imports and
a few warm-up exchanges not), the client's peak RSS (``ru_maxrss``, its whole life), and
how many POSTs were answered 200. Written to ``bench/results/<stamp>-exchanges.json``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import resource
import socket
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent  # not bench.processes: clients import little
OPTIONS = ("aiohttp", "httpx", "threads", "gevent")
SEQUENTIAL = ("aiohttp", "requests")
WARM_UP = 5  # exchanges before the measured phase (lazy imports, the first connection)
CLIENT_TIMEOUT_S = 300.0
GEVENT_BY_HAND = (
    "gevent is not importable in this Python; measured once by hand in a separate venv: "
    "0.69 ms CPU per exchange"
)
BODY = b'{"code": 0, "data": {"ok": true}}'


# -- the mock agent: uvicorn, a raw ASGI app -------------------------------------------------
def serve(port: int, delay: float) -> None:
    """Answer every request 200 with a small JSON body; a POST after ``delay`` seconds."""
    import asyncio

    import uvicorn

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        more = True
        while more:  # the whole body, as an agent reads its delivery
            more = (await receive()).get("more_body", False)
        if scope["method"] == "POST" and delay:
            await asyncio.sleep(delay)
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(BODY)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": BODY})

    uvicorn.run(
        app, host="127.0.0.1", port=port, log_level="warning", access_log=False,
        lifespan="off", backlog=4096,
    )  # fmt: skip


# -- the clients, each run in a process of its own -------------------------------------------
def delivery(i: int) -> dict[str, Any]:
    """What a hub posts to an agent, about its size."""
    return {
        "task_id": f"x-{i}",
        "attempt_seq": 1,
        "method": "bench.echo",
        "payload": {"i": i, "text": "an agent's task"},
    }


FAILURES: Counter[str] = Counter()  # this client process's failed exchanges, by kind


def _failed(exc: BaseException) -> bool:
    """Count a failed exchange by its exception's kind (what the report says went wrong)."""
    FAILURES[f"{type(exc).__name__}: {exc}"[:120]] += 1
    return False


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _timed(run: Callable[[], list[bool]]) -> tuple[list[bool], float, float]:
    """(each exchange's success, wall s, CPU s) of ``run``."""
    cpu, t0 = _cpu_s(), time.perf_counter()
    oks = run()
    return oks, time.perf_counter() - t0, _cpu_s() - cpu


async def _timed_async(
    one: Callable[[int], Awaitable[bool]], n: int, sequential: bool
) -> tuple[list[bool], float, float]:
    """`_timed` on an event loop: ``n`` calls of ``one`` gathered (or awaited in turn),
    after ``WARM_UP`` that are not measured."""
    import asyncio

    for i in range(WARM_UP):
        await one(i)
    cpu, t0 = _cpu_s(), time.perf_counter()
    if sequential:
        oks = [await one(i) for i in range(n)]
    else:
        oks = list(await asyncio.gather(*(one(i) for i in range(n))))
    return oks, time.perf_counter() - t0, _cpu_s() - cpu


def aiohttp_client(url: str, n: int, sequential: bool) -> tuple[list[bool], float, float]:
    import asyncio

    import aiohttp

    async def main() -> tuple[list[bool], float, float]:
        connector = aiohttp.TCPConnector(limit=0)
        timeout = aiohttp.ClientTimeout(total=CLIENT_TIMEOUT_S)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

            async def one(i: int) -> bool:
                try:
                    async with session.post(url, json=delivery(i)) as answer:
                        await answer.read()
                        return answer.status == 200
                except (aiohttp.ClientError, TimeoutError) as exc:
                    return _failed(exc)

            return await _timed_async(one, n, sequential)

    return asyncio.run(main())


def httpx_client(url: str, n: int, sequential: bool) -> tuple[list[bool], float, float]:
    import asyncio

    import httpx

    async def main() -> tuple[list[bool], float, float]:
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
        async with httpx.AsyncClient(limits=limits, timeout=CLIENT_TIMEOUT_S) as client:

            async def one(i: int) -> bool:
                try:
                    return (await client.post(url, json=delivery(i))).status_code == 200
                except httpx.HTTPError as exc:
                    return _failed(exc)

            return await _timed_async(one, n, sequential)

    return asyncio.run(main())


def _requests_one(session: Any, url: str, i: int) -> bool:
    import requests

    try:
        return bool(
            session.post(url, json=delivery(i), timeout=CLIENT_TIMEOUT_S).status_code == 200
        )
    except requests.RequestException as exc:
        return _failed(exc)


def threads_client(url: str, n: int, sequential: bool) -> tuple[list[bool], float, float]:
    """``requests``: a Session per thread, one thread per exchange (or one, in turn)."""
    import threading

    import requests

    warm = requests.Session()
    for i in range(WARM_UP):
        _requests_one(warm, url, i)
    if sequential:
        return _timed(lambda: [_requests_one(warm, url, i) for i in range(n)])
    oks = [False] * n

    def one(i: int) -> None:
        with requests.Session() as session:
            oks[i] = _requests_one(session, url, i)

    def run() -> list[bool]:
        threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return oks

    return _timed(run)


def gevent_client(url: str, n: int, sequential: bool) -> tuple[list[bool], float, float]:
    """``requests`` on greenlets: gevent patches the standard library first."""
    from gevent import monkey  # type: ignore[import-untyped, unused-ignore]

    monkey.patch_all()
    import gevent  # type: ignore[import-untyped, unused-ignore]
    import requests

    warm = requests.Session()
    for i in range(WARM_UP):
        _requests_one(warm, url, i)

    def one(i: int) -> bool:
        with requests.Session() as session:
            return _requests_one(session, url, i)

    def run() -> list[bool]:
        jobs = [gevent.spawn(one, i) for i in range(n)]
        gevent.joinall(jobs)
        return [bool(job.value) for job in jobs]

    return _timed(run)


CLIENTS = {
    "aiohttp": aiohttp_client,
    "httpx": httpx_client,
    "threads": threads_client,
    "requests": threads_client,  # sequential: one Session, one thread
    "gevent": gevent_client,
}


def row(oks: list[bool], wall_s: float, cpu_s: float, maxrss_kb: int) -> dict[str, Any]:
    """One client run's figures: CPU per exchange over every exchange attempted."""
    n = len(oks)
    return {
        "exchanges": n,
        "ok": sum(oks),
        "wall_s": round(wall_s, 3),
        "cpu_ms_per_exchange": round(1000 * cpu_s / n, 3) if n else None,
        "peak_rss_mb": round(maxrss_kb / 1024, 1),
    }


def client(option: str, url: str, n: int, sequential: bool) -> dict[str, Any]:
    oks, wall, cpu = CLIENTS[option](url, n, sequential)
    got = row(oks, wall, cpu, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    return {**got, "failures": dict(FAILURES.most_common(5))}


# -- the run ---------------------------------------------------------------------------------
def gevent_importable(python: str = sys.executable) -> bool:
    found = subprocess.run(
        [python, "-c", "import gevent"], capture_output=True, cwd=REPO, check=False
    )
    return found.returncode == 0


def plan(
    delays: list[float], gevent: bool
) -> list[tuple[str, float, bool]]:  # (option, delay, sequential)
    """Every measurement, in order: each option at each delay, then the sequential ones at
    D = 0; gevent only where it is importable."""
    options = [o for o in OPTIONS if gevent or o != "gevent"]
    return [(o, d, False) for d in delays for o in options] + [(o, 0.0, True) for o in SEQUENTIAL]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env() -> dict[str, str]:
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{path}" if path else str(REPO)}


class Server:
    """The mock agent in a process of its own, for one delay."""

    def __init__(self, delay: float) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}/tasks/bench.echo"
        argv = [sys.executable, "-m", "bench.exchanges", "--serve", str(delay)]
        self.proc = subprocess.Popen(
            [*argv, "--port", str(self.port)], cwd=REPO, env=_env(), stderr=subprocess.PIPE
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/", timeout=1):
                    return
            except OSError:
                if self.proc.poll() is not None:
                    why = self.proc.stderr.read().decode()[-500:] if self.proc.stderr else ""
                    raise RuntimeError(f"the mock agent exited: {why}") from None
                time.sleep(0.1)
        self.stop()
        raise RuntimeError("the mock agent did not answer within 30 s")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def run_client(option: str, url: str, n: int, sequential: bool) -> dict[str, Any]:
    """One option in a process of its own; its figures, or what went wrong."""
    argv = [sys.executable, "-m", "bench.exchanges", "--client", option, "--url", url]
    argv += ["--n", str(n)] + (["--one-at-a-time"] if sequential else [])
    try:
        done = subprocess.run(
            argv, cwd=REPO, env=_env(), capture_output=True, text=True,
            timeout=CLIENT_TIMEOUT_S + 60, check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return {"error": f"no answer within {CLIENT_TIMEOUT_S + 60:g} s"}
    if done.returncode != 0:
        return {"error": done.stderr.strip()[-500:] or f"exit {done.returncode}"}
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def measure(
    concurrent: int, sequential: int, delays: list[float], log: Callable[[str], None]
) -> dict[str, Any]:
    gevent = gevent_importable()
    out: dict[str, Any] = {"concurrent": {}, "sequential": {}}
    steps = plan(delays, gevent)
    for delay in sorted({d for _, d, _ in steps}, reverse=True):
        server = Server(delay)
        try:
            for option, d, seq in steps:
                if d != delay:
                    continue
                got = run_client(option, server.url, sequential if seq else concurrent, seq)
                where = out["sequential"] if seq else out["concurrent"].setdefault(f"{d:g}", {})
                where[option] = got
                log(f"{'sequential' if seq else f'D={d:g} s'} {option}: {got}")
        finally:
            server.stop()
    if not gevent:
        for d in delays:
            out["concurrent"].setdefault(f"{d:g}", {})["gevent"] = {"skipped": GEVENT_BY_HAND}
    return out


def _fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return str(value)


def table(result: dict[str, Any]) -> str:
    """The figures as a Markdown table: the concurrent runs, then the sequential ones."""
    lines = [
        "| option | D s | at once | OK | wall s | CPU ms / exchange | peak RSS MB |",
        "|---|---|---|---|---|---|---|",
    ]

    notes: dict[str, str] = {}

    def cells(option: str, delay: str, at_once: str, r: dict[str, Any]) -> str:
        if "skipped" in r or "error" in r:
            notes[option] = r.get("skipped") or f"failed: {r['error'][:300]}"
            verdict = "skipped" if "skipped" in r else "failed"
            return f"| {option} | {delay} | {at_once or '-'} | {verdict} | - | - | - |"
        if r.get("failures"):
            kinds = "; ".join(f"{kind.rstrip(': ')} ({n})" for kind, n in r["failures"].items())
            notes[f"{option} (D = {delay} s, {at_once} at once)"] = f"failed: {kinds}"
        return (
            f"| {option} | {delay} | {at_once} | {r['ok']} of {r['exchanges']} "
            f"| {_fmt(r['wall_s'])} | {_fmt(r['cpu_ms_per_exchange'])} "
            f"| {_fmt(r['peak_rss_mb'], 0)} |"
        )

    for delay, options in result["concurrent"].items():
        for option, r in options.items():
            lines.append(cells(option, delay, str(r.get("exchanges", "")), r))
    for option, r in result["sequential"].items():
        lines.append(cells(option, "0", "1 (sequential)", r))
    lines += [f"\n{option}: {why}" for option, why in notes.items()]
    return "\n".join(lines) + "\n"


def _versions() -> dict[str, str | None]:
    from importlib import metadata

    out: dict[str, str | None] = {}
    for name in ("aiohttp", "httpx", "requests", "uvicorn", "gevent"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.exchanges", description=__doc__)
    p.add_argument("--concurrent", type=int, default=2000, help="POSTs at once per option")
    p.add_argument("--sequential", type=int, default=500, help="POSTs one at a time")
    p.add_argument("--delays", type=float, nargs="+", default=[1.0, 0.0], help="D, seconds")
    p.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    p.add_argument("--serve", type=float, default=None, help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--client", choices=sorted(CLIENTS), default=None, help=argparse.SUPPRESS)
    p.add_argument("--url", default="", help=argparse.SUPPRESS)
    p.add_argument("--n", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--one-at-a-time", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.serve is not None:  # the mock agent's process
        serve(args.port, args.serve)
        return
    if args.client is not None:  # one client's process
        print(json.dumps(client(args.client, args.url, args.n, args.one_at_a_time)))
        return
    started = dt.datetime.now(dt.UTC)
    result = {
        "meta": {
            "command": "python -m bench.exchanges" + "".join(f" {a}" for a in (argv or [])),
            "started": started.isoformat(timespec="seconds"),
            "machine": f"{os.cpu_count()} cores, {platform.python_implementation()} "
            f"{platform.python_version()}, client and mock agent on one box",
            "versions": _versions(),
            "concurrent": args.concurrent,
            "sequential": args.sequential,
            "delays_s": args.delays,
        },
        **measure(
            args.concurrent,
            args.sequential,
            args.delays,
            lambda line: print(line, file=sys.stderr, flush=True),
        ),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{started.strftime('%Y%m%dT%H%M%S')}-exchanges.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(table(result))
    print(f"written: {path}")


if __name__ == "__main__":
    main()
