"""The scenarios of the table. Each starts what it needs, offers load, and returns numbers.

Every hub scenario uses client-chosen task ids with a scenario prefix, so after the run
the store itself says how many accepted tasks never reached a terminal state (``lost``).
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, text

from bench import clients
from bench.loadgen import Job, run_open_loop
from bench.processes import Hub, MockAgent, PeakRss, wait_routable
from bench.stats import Sample, Summary, ladder, percentile, summarise, sustainable
from reach.hub.settings import RouterSettings

_ROUTER_DEFAULTS = RouterSettings()  # the hub's router settings as shipped

LADDER_CEILING = 5000.0
NO_HUB = "http://127.0.0.1:1"  # where agents of a hub-less run look for one (nothing)
WARM_UP = 10_000_000  # warm-up requests' sequence numbers start here (see Bench.measure)


@dataclass(frozen=True)
class Plan:
    """How long and how hard: ``full`` is the table, ``quick`` a check in under two
    minutes, ``smoke`` the smallest run that still exercises every scenario (the test
    suite runs it so the harness cannot rot)."""

    level: str = "full"
    single_rate: float = 100.0
    fault_rate: float = 30.0  # 20 callers at 1.5 requests a second each
    fault_callers: int = 20
    # hub settings a run measures instead of the defaults (``--hub-env``); never the table's
    hub_env: tuple[tuple[str, str], ...] = ()
    # alternations of the on/off parts (tokens, tracing) instead of the level's (``--rounds``)
    rounds: int | None = None

    @property
    def two_hop_rate(self) -> float:
        return 20.0 if self.level == "smoke" else 100.0

    @property
    def broadcast_rate(self) -> float:
        """Broadcasts a second (x5 deliveries): the field's 50/s; the smoke run's 5/s."""
        return 5.0 if self.level == "smoke" else 50.0

    @property
    def quick(self) -> bool:
        return self.level != "full"

    @property
    def duration(self) -> float:
        return {"smoke": 2.0, "quick": 5.0}.get(self.level, 30.0)

    @property
    def fleet_sizes(self) -> list[int]:
        """Idle instances beside the echo agent at each measurement (``bench.fleet``)."""
        return {"smoke": [0, 20], "quick": [0, 500]}.get(self.level, [0, 500, 2000])

    @property
    def fleet_rate(self) -> float:
        """Single hops a second routed by capability while the fleet heartbeats."""
        return {"smoke": 5.0, "quick": 50.0}.get(self.level, 100.0)

    @property
    def fleet_probe_registrations(self) -> int:
        """Registrations timed at each fleet size (beyond those that grew it)."""
        return 10 if self.level == "smoke" else 100

    @property
    def table_rows(self) -> int:
        """Finished tasks in the store for the table-scale run (3 events each)."""
        return {"smoke": 1_000, "quick": 100_000}.get(self.level, 1_000_000)

    @property
    def soak_rate(self) -> float:
        """The soak's single hops a second (the flaky agent gets ``fault_rate`` beside)."""
        return 10.0 if self.level == "smoke" else self.single_rate

    @property
    def soak_fault_rate(self) -> float:
        return 3.0 if self.level == "smoke" else self.fault_rate

    @property
    def soak_duration(self) -> float:
        return {"smoke": 12.0, "quick": 120.0}.get(self.level, 1800.0)

    @property
    def soak_window(self) -> float:
        """The windows compared with the first (p99, RSS): 5 minutes in the full run."""
        return {"smoke": 4.0, "quick": 30.0}.get(self.level, 300.0)

    @property
    def soak_flap(self) -> tuple[float, float]:
        """The flaky agent's outage and its period, seconds (down, then up the rest)."""
        return {"smoke": (2.0, 6.0), "quick": (10.0, 30.0)}.get(self.level, (20.0, 60.0))

    @property
    def cost_rate(self) -> float:
        """The open-loop rate at which CPU per message is read (well below saturation)."""
        return 20.0 if self.level == "smoke" else 50.0

    @property
    def cost_duration(self) -> float:
        return {"smoke": 2.0, "quick": 15.0}.get(self.level, 30.0)

    @property
    def step_duration(self) -> float:
        return {"smoke": 2.0, "quick": 4.0}.get(self.level, 10.0)

    @property
    def max_rates(self) -> list[float]:
        """The throughput ladder's steps, climbed until one is not sustained (for the hub
        and both baselines alike). The ceiling only bounds a runaway: no system here
        comes near it. The smoke run climbs two steps and stops."""
        if self.level == "smoke":
            return ladder(20.0, 2.0, 40.0)
        if self.level == "quick":
            return ladder(40.0, 1.5, LADDER_CEILING)
        return ladder(40.0, 1.25, LADDER_CEILING)

    @property
    def repeats(self) -> int:
        """Runs of each scenario: the table reports the median and the spread."""
        return 1 if self.level == "smoke" else 3

    @property
    def settings(self) -> list[tuple[str, int]]:
        """Worker settings (pool, concurrency) the hub and plain Celery are also laddered
        at, after the default (prefork x4): each is reported at its best too."""
        return [] if self.level == "smoke" else [("prefork", 2)]

    @property
    def token_rounds(self) -> int:
        """Alternations of on / off (tokens, tracing; each a fresh hub): ``--rounds``, or
        two for the full run and one otherwise."""
        if self.rounds is not None:
            return self.rounds
        return 2 if self.level == "full" else 1

    @property
    def token_callers(self) -> int:
        return 4 if self.level == "smoke" else 32

    @property
    def token_rate(self) -> float:
        """An open-loop rate both configurations sustain, for the latency columns."""
        return 20.0 if self.level == "smoke" else 50.0

    @property
    def channel_rate(self) -> float:
        """An open-loop rate HTTP and channel delivery both sustain, for comparing p50."""
        return 5.0 if self.level == "smoke" else 10.0

    @property
    def fault_phases(self) -> tuple[float, float, float]:
        """Seconds before, during and after the outage."""
        return {"smoke": (3.0, 4.0, 3.0), "quick": (3.0, 8.0, 4.0)}.get(
            self.level, (10.0, 40.0, 15.0)
        )

    @property
    def breaker_trial(self) -> float:
        """The scenarios' hub's breaker trial interval: the hub's default (30 s) in the
        table; 2 s in the smoke run, whose fault part otherwise waits out one 30-s trial
        for the tasks deferred during its 4-s outage (half the smoke run's wall time)."""
        trial = self.hub_settings.get("REACH_ROUTER__BREAKER_TRIAL_INTERVAL")
        return float(trial) if trial else _ROUTER_DEFAULTS.breaker_trial_interval

    @property
    def fault_wait(self) -> float:
        """How long a fault-run caller waits: past the whole retry schedule (1+2+4+8+16 s,
        +20 % jitter) and past the outage and two breaker trials, because a retry due while
        the breaker is open is deferred to its next trial (`reach.hub.delivery`): a task
        accepted as the outage began ends only once a trial meets the agent back up. Every
        accepted task must end (success or dead letter) before its caller gives up."""
        return max(45.0, self.fault_phases[1] + 2 * self.breaker_trial + 20)

    @property
    def hub_settings(self) -> dict[str, str]:
        """The smoke run shortens retry backoff and the breaker's trial interval so the fault
        run drains in seconds; the table itself is measured on the defaults, but for the
        queue bound: the in-flight run puts all its tasks on one agent, past the default
        bound (1,000 per agent), and measures in-flight capacity, not backpressure (the
        ``backpressure`` part's)."""
        if self.level == "smoke":
            return {
                "REACH_ROUTER__BACKOFF_BASE": "0.2",
                "REACH_ROUTER__BACKOFF_CAP": "1",
                "REACH_ROUTER__BREAKER_TRIAL_INTERVAL": "2",
                **dict(self.hub_env),
            }
        bound = max(_ROUTER_DEFAULTS.max_queue, 2 * self.inflight_tasks)
        return {"REACH_ROUTER__MAX_QUEUE": str(bound), **dict(self.hub_env)}

    @property
    def inflight_tasks(self) -> int:
        return {"smoke": 50, "quick": 300}.get(self.level, 2000)

    @property
    def inflight_max_concurrency(self) -> int:
        """What each in-flight agent declares: room for every task at one instance, so
        the hub's routing never meets a full agent (a 429 is not what is measured)."""
        return max(256, self.inflight_tasks)

    # -- agents that think (bench.slow), on a hub of its own --------------------------------
    slow_handler_s: float = 2.0  # each handler's thinking time, slow_agents and broadcast50
    slow_max_concurrency: int = 400  # declared by each slow agent: above a whole batch

    @property
    def slow_tasks(self) -> int:
        """Tasks submitted at once to each slow agent (the issue's 200 in the full run)."""
        return {"smoke": 20, "quick": 100}.get(self.level, 200)

    @property
    def fan_instances(self) -> int:
        """Instances a broadcast reaches (the issue's 50), all served by one process."""
        return {"smoke": 10, "quick": 25}.get(self.level, 50)

    @property
    def fan_broadcasts(self) -> int:
        """Broadcasts measured one after the other (after one that warms the hub up)."""
        return {"smoke": 2, "quick": 3}.get(self.level, 5)

    # -- flow control (bench.flow), each scenario on a hub of its own ----------------------
    storm_callers: int = 5
    storm_rereach: int = 3  # a caller whose reach failed reaches again at once, this often
    storm_rate: float = 10.0  # all callers together: 2 reaches a second each

    @property
    def storm_phases(self) -> tuple[float, float, float]:
        """Seconds before, during and after the order agent's outage (the field's: 40 s)."""
        return {"smoke": (2.5, 3.0, 2.0), "quick": (5.0, 12.0, 6.0)}.get(
            self.level, (10.0, 40.0, 15.0)
        )

    @property
    def storm_trial_interval(self) -> float:
        """The breaker's trial interval: the default (30 s) in the full run; shorter runs
        shorten it with the outage, or the breaker would outlast the whole run."""
        return {"smoke": 1.0, "quick": 4.0}.get(self.level, 30.0)

    @property
    def storm_wait(self) -> float:
        """How long a caller waits for an accepted reach: past the outage and two trials."""
        return {"smoke": 15.0}.get(
            self.level, self.storm_phases[1] + 2 * self.storm_trial_interval + 20
        )

    @property
    def loop_alert_threshold(self) -> int:
        return 3

    @property
    def loop_alert_roots(self) -> int:
        """Separate roots each way (A -> B, B -> A): past the threshold on both."""
        return self.loop_alert_threshold + 2

    priority_rate: float = 20.0  # online single hops a second, unloaded and under the flood
    bg_latency: float = 0.25  # the background agent's answer time (its slots: the worker's count)
    bg_drain: float = 90.0

    @property
    def priority_duration(self) -> float:
        return {"smoke": 2.0, "quick": 8.0}.get(self.level, 30.0)

    bp_max_queue: int = 100
    bp_drain: float = 60.0

    @property
    def bp_rate(self) -> float:
        """The fast caller's submits a second."""
        return 150.0 if self.level == "smoke" else 100.0

    @property
    def bp_latency(self) -> float:
        """The slow agent's answer time (sync: 20/s on 4 workers; the smoke's 40/s drains
        its full queue in half the time)."""
        return 0.1 if self.level == "smoke" else 0.2

    @property
    def bp_duration(self) -> float:
        return {"smoke": 2.0, "quick": 5.0}.get(self.level, 30.0)

    @property
    def flow_shared_hub(self) -> bool:
        """The smoke run puts its flow-control scenarios on one hub (their settings do not
        collide at that size); quick and full give each a fresh hub."""
        return self.level == "smoke"

    def flow_env(self, name: str) -> dict[str, str]:
        """The hub settings each flow-control scenario runs with (on top of hub_settings)."""
        if name == "retry_storm":
            env = {"REACH_ROUTER__BREAKER_TRIAL_INTERVAL": str(self.storm_trial_interval)}
            if self.level == "smoke":  # 4 s of outage: open on less evidence
                env["REACH_ROUTER__BREAKER_MIN_VOLUME"] = "10"
            return env
        if name == "loop":
            return {"REACH_ROUTER__LOOP_ALERT_THRESHOLD": str(self.loop_alert_threshold)}
        if name == "priority" and not self.flow_shared_hub:
            # the flood must not meet the queue bound: that is not what is measured (the
            # smoke's shared hub has backpressure's bound, above its smaller flood)
            return {"REACH_ROUTER__MAX_QUEUE": "1000000"}
        if name == "backpressure":
            return {"REACH_ROUTER__MAX_QUEUE": str(self.bp_max_queue)}
        return {}


@dataclass
class Bench:
    """What every scenario shares: the hub, a place for logs, and the store to audit."""

    hub: Hub
    home: Path
    plan: Plan
    agents: dict[str, list[MockAgent]] = field(default_factory=dict)
    _seq: itertools.count[int] = field(default_factory=itertools.count)

    def agent(
        self, agent_id: str, count: int = 1, *, mode: str = "sync", latency: float = 0.0, **kw: Any
    ) -> list[MockAgent]:
        if agent_id not in self.agents:
            # without a hub (the baselines run with it stopped) the agent serves anyway
            hub_url = self.hub.url or NO_HUB
            self.agents[agent_id] = [
                MockAgent(hub_url, agent_id, self.home, mode, latency, **kw).start()
                for _ in range(count)
            ]
            if self.hub.url:
                wait_routable(self.hub.url, [agent_id])
        return self.agents[agent_id]

    def stop_agents(self) -> None:
        for agents in self.agents.values():
            for agent in agents:
                agent.stop()
        self.agents.clear()

    def lost(self, prefix: str, drain: float = 30.0) -> int:
        """Accepted tasks with this id prefix that are still not terminal after ``drain``."""
        engine = create_engine(self.hub.env["REACH_DATABASE_URL"])
        try:
            deadline = time.monotonic() + drain
            while True:
                with engine.connect() as conn:
                    open_tasks = conn.execute(
                        text(
                            "SELECT count(*) FROM tasks WHERE task_id LIKE :p "
                            "AND status NOT IN ('success','failed','dead','cancelled')"
                        ),
                        {"p": prefix + "%"},
                    ).scalar_one()
                if not open_tasks or time.monotonic() >= deadline:
                    return int(open_tasks)
                time.sleep(0.5)
        finally:
            engine.dispose()

    def measure(
        self, job: Job, rate: float, duration: float, *, max_threads: int = 256
    ) -> tuple[list[Sample], float, float]:
        """Warm up briefly, then run the measured load; returns (samples, wall, peak MB).
        The warm-up's sequence numbers are far from the run's: a job's task id is made from
        its number, and a measured request that repeated a warm-up id would be answered
        from the store (or the agent's dedup) without being delivered."""
        run_open_loop(lambda i: job(WARM_UP + i), min(rate, 20.0), 1.0, max_threads=max_threads)
        with PeakRss(self.hub.pids()) as rss:
            samples, wall = run_open_loop(job, rate, duration, max_threads=max_threads)
        return samples, wall, rss.peak_mb

    def prefix(self, name: str) -> str:
        return f"{name}-{next(self._seq)}-"


def _ids(prefix: str) -> Callable[[int], str]:
    return lambda i: f"{prefix}{i}"


def hub_single(bench: Bench, rate: float, duration: float, name: str = "single") -> Summary:
    bench.agent("echo")
    prefix = bench.prefix(name)
    task_id = _ids(prefix)

    def job(i: int) -> None:
        clients.hub_call(
            bench.hub.url,
            {
                "agent_id": "echo",
                "method": "bench.echo",
                "payload": {"i": i},
                "task_id": task_id(i),
            },
        )

    samples, wall, peak = bench.measure(job, rate, duration)
    return summarise(samples, wall, offered_rate=rate, lost=bench.lost(prefix), peak_rss_mb=peak)


def direct_single(bench: Bench, rate: float, duration: float) -> Summary:
    """Baseline (a): the same client posting straight to the same agent."""
    return _baseline(bench, "direct", clients.direct_call, rate, duration)


def celery_single(bench: Bench, rate: float, duration: float) -> Summary:
    """Baseline (b): a plain Celery task posting to the same agent."""
    return _baseline(bench, "celery", clients.celery_call, rate, duration)


def _baseline(
    bench: Bench, name: str, call: Callable[[str, str, dict[str, Any]], Any], rate: float,
    duration: float,
) -> Summary:  # fmt: skip
    (echo,) = bench.agent("echo")
    prefix = bench.prefix(name)

    def job(i: int) -> None:
        call(echo.url, f"{prefix}{i}", {"i": i})

    samples, wall, _ = bench.measure(job, rate, duration)
    return summarise(samples, wall, offered_rate=rate)


def two_hop(bench: Bench) -> Summary:
    bench.agent("echo")
    bench.agent("front", mode="forward", forward_to="echo")
    prefix = bench.prefix("twohop")
    rate, duration = bench.plan.two_hop_rate, bench.plan.duration

    def job(i: int) -> None:
        clients.hub_call(
            bench.hub.url,
            {
                "agent_id": "front",
                "method": "bench.echo",
                "payload": {"i": i},
                "task_id": f"{prefix}{i}",
            },
        )

    samples, wall, peak = bench.measure(job, rate, duration)
    return summarise(samples, wall, offered_rate=rate, lost=bench.lost(prefix), peak_rss_mb=peak)


def broadcast5(bench: Bench) -> Summary:
    for i in range(5):
        bench.agent(f"fan-{i}")
    rate, duration = bench.plan.broadcast_rate, bench.plan.duration

    def job(i: int) -> None:
        view = clients.broadcast_call(
            bench.hub.url,
            {
                "tags": ["bench"],
                "capability": "bench.echo",
                "rules": {},
                "method": "bench.echo",
                "payload": {"i": i},
            },
        )
        got = sum(1 for t in view["results"] if t["status"] == "success")
        if got < 5:
            raise clients.CallFailed(f"{got} of 5 targets answered")

    samples, wall, peak = bench.measure(job, rate, duration)
    return summarise(samples, wall, offered_rate=rate, lost=bench.lost("b-"), peak_rss_mb=peak)


def inflight(bench: Bench, max_throughput: float) -> tuple[Summary, dict[str, Any]]:
    """``inflight_tasks`` submitted at once to two agents whose ``def`` handlers answer
    each in its exchange after 1 s: every task holds an exchange for its whole second
    (an agent that answers 202 and reports would hold none)."""
    bench.agent(
        "slow", 2, mode="sync", latency=1.0, max_concurrency=bench.plan.inflight_max_concurrency
    )
    count = bench.plan.inflight_tasks
    prefix = bench.prefix("inflight")

    def job(i: int) -> None:
        clients.hub_call(
            bench.hub.url,
            {
                "agent_id": "slow",
                "method": "bench.echo",
                "payload": {"i": i},
                "task_id": f"{prefix}{i}",
                "timeout_ms": 120_000,
            },
            wait=60,
        )

    with PeakRss(bench.hub.pids()) as rss:
        samples, wall = run_open_loop(job, count / 0.5, 0.5, max_threads=count)
    summary = summarise(
        samples, wall, offered_rate=count / 0.5, lost=bench.lost(prefix), peak_rss_mb=rss.peak_mb
    )
    limit = 1.0 + count / max_throughput if max_throughput else float("nan")
    return summary, {
        "tasks": count,
        "agent": "2 instances, def handler answering after 1 s",
        "wall_s": round(wall, 2),
        "wall_limit_s": round(limit, 2),
    }


def closed_loop(
    bench: Bench, callers: int, duration: float, name: str = "closed", agent_id: str = "echo"
) -> Summary:
    """``callers`` threads each submitting a single hop and waiting for its answer, again
    and again: the completed rate at saturation. Coarser than the open loop for latency
    (it slows down with the system), finer for comparing two configurations' capacity,
    which the open loop's rate ladder can only tell apart in steps of 20 msg/s.
    ``agent_id`` other than the bench's echo agent must already be running."""
    if agent_id == "echo":
        bench.agent("echo")
    prefix = bench.prefix(name)
    samples: list[Sample] = []
    lock = threading.Lock()
    seq = itertools.count()
    t0 = stop_at = 0.0  # set once warmed up: the warm-up must not eat the measured time

    def caller() -> None:
        while time.perf_counter() < stop_at:
            i = next(seq)
            started = time.perf_counter()
            try:
                clients.hub_call(
                    bench.hub.url,
                    {
                        "agent_id": agent_id,
                        "method": "bench.echo",
                        "payload": {"i": i},
                        "task_id": f"{prefix}{i}",
                    },
                )
                ok, error = True, ""
            except Exception as exc:
                ok, error = False, f"{type(exc).__name__}: {exc}"[:300]
            with lock:
                samples.append(Sample(started - t0, time.perf_counter() - started, ok, error))

    def warm(i: int) -> None:
        clients.hub_call(
            bench.hub.url,
            {
                "agent_id": agent_id,
                "method": "bench.echo",
                "payload": {},
                "task_id": f"{prefix}w{i}",
            },
        )

    run_open_loop(warm, 20.0, 1.0)
    t0 = time.perf_counter()
    stop_at = t0 + duration
    threads = [threading.Thread(target=caller, daemon=True) for _ in range(callers)]
    with PeakRss(bench.hub.pids()) as rss:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    wall = time.perf_counter() - t0
    return summarise(samples, wall, lost=bench.lost(prefix), peak_rss_mb=rss.peak_mb)


def max_throughput(
    run: Callable[[float, float], Summary], rates: list[float], duration: float
) -> tuple[float, list[dict[str, Any]]]:
    """The highest offered rate that was sustained; stops at the first that was not."""
    best = 0.0
    steps = []
    for rate in rates:
        summary = run(rate, duration)
        ok = sustainable(summary, rate)
        steps.append({"offered": rate, "sustained": ok, **summary.as_dict()})
        if not ok:
            break
        best = max(best, summary.rate)
    return best, steps


class Tombstone:
    """What answers on a dead agent's port: 503 to everything, counting every request."""

    def __init__(self, port: int) -> None:
        self.times: list[float] = []
        times = self.times

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _answer(self) -> None:
                if self.path.startswith("/tasks/"):
                    times.append(time.time())
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                body = b'{"code": -1, "message": "down"}'
                self.send_response(503)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                # no keep-alive: once the agent is back, no pooled connection of the
                # hub's may still end here (the tombstone's threads outlive its socket)
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(body)
                self.close_connection = True

            do_GET = do_POST = _answer

            def log_message(self, *args: Any) -> None:
                pass

            def handle(self) -> None:
                with contextlib.suppress(ConnectionError):
                    super().handle()

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def fault(bench: Bench) -> tuple[Summary, dict[str, Any]]:
    """One agent down (503 on its port) for a while, ``fault_callers`` callers sending."""
    (victim,) = bench.agent("flaky")
    before, during, after = bench.plan.fault_phases
    rate = bench.plan.fault_rate
    prefix = bench.prefix("fault")
    outcomes: dict[str, int] = {}
    lock = threading.Lock()

    def job(i: int) -> None:
        body = {
            "agent_id": "flaky",
            "method": "bench.echo",
            "payload": {"i": i},
            "task_id": f"{prefix}{i}",
        }
        try:
            clients.hub_call(bench.hub.url, body, wait=bench.plan.fault_wait)
            kind = "success"
        except clients.CallFailed as exc:
            kind = _fault_kind(str(exc))
        except Exception:
            kind = "error"
        with lock:
            outcomes[kind] = outcomes.get(kind, 0) + 1
        if kind != "success":  # a refusal or a dead letter is an answer, not a success
            raise clients.CallFailed(kind)

    start = time.time()
    tomb: Tombstone | None = None
    result: dict[str, Any] = {}

    def outage() -> None:
        nonlocal tomb
        time.sleep(before)
        received_before = victim.received()
        result["received_before"] = received_before
        assert victim.proc is not None
        victim.kill()
        result["down_at"] = time.time()
        tomb = Tombstone(victim.port)
        time.sleep(during)
        tomb.close()
        result["up_at"] = time.time()
        victim.start()

    side = threading.Thread(target=outage, daemon=True)
    side.start()
    with PeakRss(bench.hub.pids()) as rss:
        samples, wall = run_open_loop(job, rate, before + during + after, max_threads=256)
    side.join()
    end = time.time()
    received_after = victim.received() if _alive(victim) else {}
    assert tomb is not None
    per_sec: dict[int, int] = {}
    for source in (result["received_before"], received_after):
        for sec, n in source.items():
            per_sec[sec] = per_sec.get(sec, 0) + n
    for t in tomb.times:
        per_sec[int(t)] = per_sec.get(int(t), 0) + 1
    first = int(start)
    timeline = [per_sec.get(first + i, 0) for i in range(int(end) - first + 1)]
    down = int(result["down_at"]) - first
    up = int(result["up_at"]) - first
    normal = timeline[1:down] or [0]
    outage_counts = timeline[down:up] or [0]
    normal_rate = sum(normal) / len(normal)
    summary = summarise(
        samples, wall, offered_rate=rate, lost=bench.lost(prefix, drain=60), peak_rss_mb=rss.peak_mb
    )
    # the row: rate and latency of successes; errors are callers left without a definitive
    # answer; fast refusals and dead letters are columns of their own
    summary = replace(summary, errors=outcomes.get("gave_up", 0) + outcomes.get("error", 0))
    return summary, {
        "successes": outcomes.get("success", 0),
        "fast_refusals": outcomes.get("fast_failure", 0),
        "dead_letters": outcomes.get("dead", 0),
        "refusal_p50_ms": _p50_of(samples, "fast_failure"),
        "dead_letter_p50_ms": _p50_of(samples, "dead"),
        "timeline_per_s": timeline,
        "outage_from_s": down,
        "outage_to_s": up,
        "normal_rate": round(normal_rate, 2),
        "outage_peak_rate": max(outage_counts),
        "outage_mean_rate": round(sum(outage_counts) / len(outage_counts), 2),
        "peak_to_normal": round(max(outage_counts) / normal_rate, 2) if normal_rate else None,
        "outcomes": outcomes,
        "callers": bench.plan.fault_callers,
        "slowest_answer_s": round(max((x.latency_s for x in samples), default=0.0), 2),
        "tombstone_requests": len(tomb.times),
    }


def _p50_of(samples: list[Sample], kind: str) -> float | None:
    """The median time to a fault-run answer of this kind (a refusal, a dead letter)."""
    values = [x.latency_s * 1000 for x in samples if not x.ok and x.error.endswith(kind)]
    return round(percentile(values, 50), 1) if values else None


def _fault_kind(message: str) -> str:
    """What a fault-run caller got: a fast refusal, a dead letter, or no answer in time."""
    if "circuit-open" in message or "HTTP 503" in message:
        return "fast_failure"
    if "dead" in message:
        return "dead"
    if "ended" in message:
        return "gave_up"
    return "error"


def _alive(agent: MockAgent) -> bool:
    from bench.processes import wait_ok

    try:
        wait_ok(f"{agent.url}/healthz", timeout=15)
    except RuntimeError:
        return False
    return True
