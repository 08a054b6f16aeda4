"""``reach up``: the whole hub (API, worker, beat, demo agents) as child processes.

Each part runs as the same process it would be in production (``reach api`` …), so the
one-command demo exercises the real topology. If any child dies, everything stops and the
exit code says so: a half-running hub is worse than none.

The terminal is for a newcomer: a short banner (the hub, its dashboard, Flower, auth, where
the logs are), one line per demo agent as it comes online, then quiet until something goes
wrong. The children's own output goes to ``<storage.home>/logs/<name>.log``; ``--verbose``
streams it to the terminal instead.

Children never outlive the supervisor. Each runs in its own session, so Ctrl-C in the
terminal reaches only the supervisor, which stops them in order (demo agents first, so they
deregister while the API still answers; the API last). SIGINT, SIGTERM and SIGHUP (the
terminal closing) all stop it that way, also while it is already stopping. On Linux each
child also asks the kernel for SIGTERM when the supervisor dies (``PR_SET_PDEATHSIG``), so
not even ``kill -9`` of the supervisor leaves an orphan holding the port.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import IO

import requests
from rich.console import Console
from rich.markup import escape
from rich.text import Text
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from reach.cli.flower import flower_supported
from reach.core.security.auth import auth_required, is_loopback_host, parse_secret
from reach.core.security.networks import is_demo_hub
from reach.hub import logs
from reach.hub.settings import Settings
from reach.hub.storage import upgrade_database


class _Console(Console):
    def on_broken_pipe(self) -> None:
        # rich would raise SystemExit here, in the middle of stopping the children
        _silence()


console = _Console(soft_wrap=True, highlight=False)
err_console = _Console(stderr=True, soft_wrap=True, highlight=False)


def _silence() -> None:
    """The terminal is gone: write nowhere from now on (and let the exit flush succeed)."""
    console.quiet = err_console.quiet = True
    devnull = os.open(os.devnull, os.O_WRONLY)
    for fd in (1, 2):
        try:
            os.dup2(devnull, fd)
        except OSError:
            pass
    os.close(devnull)


# Started in this order on consecutive ports from --demo-port (7101 …); the last three
# serve the capabilities the shipped DAGs in dags/ use.
DEMO_AGENTS = (
    ("doc_analyzer.py", "doc-analyzer-01"),
    ("summarizer.py", "summarizer-01"),
    ("sales_agent.py", "sales-agent-01"),
    ("knowledge_agent.py", "knowledge-agent-01"),
    ("chat_agent.py", "chat-agent-01"),
)
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
STOP_GRACE_S = 10.0  # per stage (agents, worker and beat, API), then SIGKILL
HEALTHY_TIMEOUT_S = 60.0
DEMO_SLOW_S = 30.0  # a demo agent not online by then gets a line pointing at its log
LOG_TAIL_LINES = 20
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
API_KEY_ENV = "REACH_API_KEY"  # what the SDK and the CLI read (reach.sdk.hub_client)
LOOPBACK_AGENTS_ENV = "REACH_SECURITY__ALLOW_LOOPBACK_AGENTS"
DEMO_KEY_TTL_S = 86_400.0
DEMO_KEY_ACTOR = "cli:reach-up"


@dataclass
class Child:
    name: str
    proc: subprocess.Popen[bytes]
    stage: int  # stopped from the highest stage down: 2 agents, 1 worker and beat, 0 API
    log: Path | None = None


@dataclass
class StopRequest:
    """What the signal handlers record: the first signal stops gently, a second Ctrl-C or
    SIGTERM hurries (SIGKILL at once); SIGHUP never hurries (nobody is watching)."""

    signum: int | None = None
    hurry: bool = False

    def __call__(self, signum: int, _frame: FrameType | None) -> None:
        if self.signum is not None and signum != signal.SIGHUP:
            self.hurry = True
        self.signum = self.signum or signum


class Screen:
    """The supervisor's own lines; a closed terminal (SIGHUP) must not stop the shutdown.
    With JSON logs (``logging.format``) each is a log line of ``reach.cli.up``, its markup
    dropped, and the children write JSON lines to their logs as well."""

    def say(self, text: str = "", *, to_stderr: bool = False) -> None:
        if logs.configured_role() is not None:
            if text.strip():
                level = logging.WARNING if to_stderr else logging.INFO
                logging.getLogger("reach.cli.up").log(level, Text.from_markup(text).plain.strip())
            return
        try:
            (err_console if to_stderr else console).print(text)
        except OSError:  # EIO: the terminal went away (EPIPE lands in on_broken_pipe)
            _silence()


def run_up(
    settings: Settings,
    *,
    port: int,
    demo: bool,
    concurrency: int,
    demo_port: int = 7101,
    verbose: bool = False,
) -> int:
    stop = StopRequest()
    previous = {sig: signal.signal(sig, stop) for sig in STOP_SIGNALS}
    screen = Screen()
    children: list[Child] = []
    keys = DemoKeys()
    try:
        busy = busy_port_problem(settings, port, demo_port if demo else None)
        if busy:
            screen.say(f"[red]reach up:[/red] {escape(busy)}", to_stderr=True)
            return 2
        code = _supervise(
            settings, screen, stop, children, keys, port, demo, concurrency, demo_port, verbose
        )
        if stop.signum is not None and code == 0:
            name = signal.Signals(stop.signum).name
            screen.say(f"stopping ({name}) … (Ctrl-C again to kill at once)")
        return code
    finally:
        for name in _terminate(children, stop):
            screen.say(f"[yellow]{name} did not stop within {STOP_GRACE_S:g} s: killed[/yellow]")
        try:
            keys.revoke(settings.storage.resolved_database_url)
        except SQLAlchemyError as exc:
            screen.say(
                f"[yellow]the demo agents' keys were not revoked ({type(exc).__name__}); "
                "they expire in a day[/yellow]"
            )
        if children:
            screen.say("stopped")
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _supervise(
    settings: Settings,
    screen: Screen,
    stop: StopRequest,
    children: list[Child],
    keys: DemoKeys,
    port: int,
    demo: bool,
    concurrency: int,
    demo_port: int,
    verbose: bool,
) -> int:
    url = settings.storage.resolved_database_url
    screen.say(
        f"[bold]Agent-Reach[/bold]: starting the API, a worker and beat ({_stores(settings)}) …"
    )
    upgrade_database(url)
    home = settings.storage.home_path
    # Counters of an earlier run would be merged into this one's; nobody writes yet.
    for stale in (home / "metrics").glob("*.db"):
        stale.unlink(missing_ok=True)
    logs = None if verbose else home / "logs"
    if logs is not None:
        logs.mkdir(parents=True, exist_ok=True)
    hub_url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "REACH_HUB_URL": hub_url}
    examples = find_examples_dir() if demo else None
    opened = examples is not None and demo_needs_loopback(settings)
    if opened:  # the demo agents listen on this machine's loopback, next to the hub
        env[LOOPBACK_AGENTS_ENV] = "true"
    me = [sys.executable, "-m", "reach"]

    def spawn(name: str, argv: list[str], stage: int, key: str | None = None) -> None:
        child_env = env if key is None else {**env, API_KEY_ENV: key}
        children.append(_spawn(name, argv, child_env, stage, logs))

    spawn("api", [*me, "api", "--port", str(port)], 0)
    spawn("worker", [*me, "worker", "--concurrency", str(concurrency)], 1)
    spawn("beat", [*me, "beat"], 1)
    healthy = _wait_healthy(hub_url, children, stop, HEALTHY_TIMEOUT_S)
    if stop.signum is not None:
        return 0
    if not healthy:
        dead = next((c for c in children if c.proc.poll() is not None), children[0])
        screen.say(f"[red]the hub did not start: {dead.name} {_fate(dead)}[/red]")
        _show_tail(screen, dead)
        return 1
    demo_ids: list[str] = []
    if examples is not None:
        if _auth_on(settings) and not os.environ.get(API_KEY_ENV):
            keys.create(url, [agent_id for _, agent_id in DEMO_AGENTS])
        for offset, (script, agent_id) in enumerate(DEMO_AGENTS):
            argv = [sys.executable, str(examples / script), "--port", str(demo_port + offset)]
            spawn(script.removesuffix(".py"), argv, 2, keys.agents.get(agent_id))
            demo_ids.append(agent_id)
    for line in banner_lines(settings, hub_url, logs, made_keys=bool(keys.key_ids)):
        screen.say(line)
    if opened:
        screen.say(
            "  agents     loopback agent addresses allowed for this run (the demo agents "
            "run beside the hub); --no-demo keeps them refused"
        )
    if demo and examples is None:
        screen.say("[yellow]examples/agents/ not found: no demo agents[/yellow]")
    elif demo_ids:
        last = demo_port + len(demo_ids) - 1
        screen.say(f"demo agents (ports {demo_port}-{last}):")
    watch = DemoWatch(hub_url, demo_ids, logs, keys.viewer or os.environ.get(API_KEY_ENV))
    while stop.signum is None:
        for child in children:
            if child.proc.poll() is not None:
                screen.say(f"[red]{child.name} {_fate(child)}; stopping the hub[/red]")
                _show_tail(screen, child)
                return 1
        for line in watch.poll():
            screen.say(line)
        time.sleep(0.25)
    return 0


def banner_lines(
    settings: Settings, hub_url: str, logs: Path | None, *, made_keys: bool = False
) -> list[str]:
    """What ``reach up`` says once the API answers: where everything is, in a few lines."""
    broker = settings.storage.resolved_broker_url
    lines = [
        "[bold]Agent-Reach is up[/bold]",
        f"  hub        [bold]{hub_url}[/bold]   API docs: {hub_url}/docs",
        f"  dashboard  {hub_url}/ui",
    ]
    if flower_supported(broker):
        lines.append("  flower     reach flower --port 5555   (then http://127.0.0.1:5555)")
    else:
        lines.append(
            "  flower     needs Redis or RabbitMQ (REACH_BROKER_URL=redis://…); "
            "the embedded broker has no task events"
        )
    notice = _open_notice(settings)
    if notice:
        lines.append(f"  [yellow]{notice}[/yellow]")
    else:
        lines.append(f"  auth       {_credentials_hint(made_keys)}")
    if logs is None:
        lines.append("  logs       streamed below (--verbose)")
    else:
        lines.append(
            f"  logs       {_shown_path(logs)}/ (api.log, worker.log, beat.log, one per "
            "demo agent; --verbose streams them here)"
        )
    lines.append("  `reach agents` lists the fleet; Ctrl-C stops")
    return lines


def _credentials_hint(made_keys: bool) -> str:
    """How to get and pass an API key when the hub requires one; never the secret itself."""
    secret = os.environ.get(API_KEY_ENV, "")
    key_id = parse_secret(secret) if secret else None
    if key_id:
        return f"on: the CLI and the demo agents use $REACH_API_KEY (key {key_id})"
    made = ""
    if made_keys:
        made = "each demo agent got a key of its own for this run (revoked when it stops); "
    return (
        f"on: API keys required; {made}for the CLI create one with "
        "`reach keys create --scope admin --name me` (it prints the secret once) "
        "and export it as REACH_API_KEY"
    )


def _auth_on(settings: Settings) -> bool:
    return auth_required(settings.security.require_auth, settings.server.host)


def demo_needs_loopback(settings: Settings) -> bool:
    """Whether the hub would refuse the demo agents' loopback addresses: it listens beyond
    loopback or requires keys (the image's ``reach up`` on 0.0.0.0), and the operator did
    not allow loopback agents already. ``reach up`` then allows them for its own children,
    as a local demo hub does; with ``--no-demo`` nothing is opened."""
    security = settings.security
    demo_hub = is_demo_hub(security.require_auth, settings.server.host)
    return not demo_hub and not security.allow_loopback_agents


@dataclass
class DemoKeys:
    """The keys ``reach up`` makes when the hub requires auth and it was given none: an
    agent key per demo agent (bound to its ID) and a viewer key for its own "online" lines.

    The secrets exist only in this process and in each agent's environment, never on the
    terminal or in a log; the keys are revoked when ``reach up`` stops and expire after a
    day should it never get there (``kill -9``)."""

    agents: dict[str, str] = field(default_factory=dict)
    viewer: str | None = None
    key_ids: list[str] = field(default_factory=list)

    def create(self, database_url: str, agent_ids: list[str]) -> None:
        from reach.core.security.auth import Scope
        from reach.hub.security import apikeys, audit

        now = time.time()
        with self._session(database_url) as session:
            wanted = [(Scope.AGENT, agent_id) for agent_id in agent_ids]
            for scope, pattern in [*wanted, (Scope.VIEWER, None)]:
                key = apikeys.create_key(
                    session,
                    scope=scope,
                    agent_pattern=pattern,
                    name=f"reach up: {pattern or 'supervisor'}",
                    expires_in_s=DEMO_KEY_TTL_S,
                    now=now,
                )
                audit.record(
                    session,
                    actor=DEMO_KEY_ACTOR,
                    action="key.create",
                    outcome=audit.ALLOWED,
                    now=now,
                    target=f"key:{key.key_id}",
                    detail={"scope": key.scope.value, "agent_pattern": key.agent_pattern},
                )
                self.key_ids.append(key.key_id)
                if pattern is None:
                    self.viewer = key.secret
                else:
                    self.agents[pattern] = key.secret

    def revoke(self, database_url: str) -> None:
        if not self.key_ids:
            return
        from reach.hub.security import apikeys, audit

        now = time.time()
        with self._session(database_url) as session:
            for key_id in self.key_ids:
                apikeys.revoke_key(session, key_id, now)
                audit.record(
                    session,
                    actor=DEMO_KEY_ACTOR,
                    action="key.revoke",
                    outcome=audit.ALLOWED,
                    now=now,
                    target=f"key:{key_id}",
                )
        self.key_ids.clear()

    @staticmethod
    @contextmanager
    def _session(database_url: str) -> Iterator[Session]:
        from reach.hub.storage import create_engine_for, session_factory

        engine = create_engine_for(database_url)
        try:
            with session_factory(engine).begin() as session:
                yield session
        finally:
            engine.dispose()


def _open_notice(settings: Settings) -> str | None:
    """The line saying the hub runs without authentication, if it does."""
    host = settings.server.host
    if auth_required(settings.security.require_auth, host):
        return None
    if is_loopback_host(host):
        return (
            "auth is off: the API listens on loopback only; "
            "set REACH_SECURITY__REQUIRE_AUTH=true to require API keys"
        )
    return f"auth is off on {host}: security.require_auth is false, anyone who reaches it is admin"


class DemoWatch:
    """Reports each demo agent once as it comes online, then stops asking the API."""

    def __init__(
        self, hub_url: str, agent_ids: list[str], logs: Path | None, api_key: str | None
    ) -> None:
        self.hub_url = hub_url
        self.waiting = list(agent_ids)
        self.started = time.monotonic()
        self.next_poll = 0.0
        self.warned = False
        self.logs = logs
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    def poll(self) -> list[str]:
        now = time.monotonic()
        if not self.waiting or now < self.next_poll:
            return []
        self.next_poll = now + 0.5
        try:
            r = requests.get(f"{self.hub_url}/api/v1/agents", headers=self.headers, timeout=2)
        except requests.RequestException:
            return []
        if r.status_code in (401, 403):  # auth on and no key that may list: stop asking
            self.waiting = []
            return ["  (the demo agents are starting; `reach agents --api-key …` lists them)"]
        try:
            agents = r.json()["agents"] if r.ok else []
        except (ValueError, KeyError, TypeError):  # not the hub's answer: ask again later
            return []
        lines = []
        for agent in agents:
            if agent["agent_id"] in self.waiting and agent.get("status") == "online":
                self.waiting.remove(agent["agent_id"])
                caps = ", ".join(c["type"] for c in agent.get("capabilities", []))
                lines.append(f"  [green]online[/green]  {agent['agent_id']:<20} {caps}")
        if not self.waiting and lines:
            lines.append(
                "all demo agents online; try: reach send text.summarize "
                '--agent summarizer-01 --payload \'{"text": "Hello agents. Bye."}\''
            )
        elif self.waiting and not self.warned and now - self.started > DEMO_SLOW_S:
            self.warned = True
            where = f" (logs in {_shown_path(self.logs)}/)" if self.logs else ""
            lines.append(f"[yellow]  not online yet: {', '.join(self.waiting)}{where}[/yellow]")
        return lines


def busy_port_problem(settings: Settings, port: int, demo_port: int | None) -> str | None:
    """Why ``reach up`` cannot start on these ports (one is taken), or None. Checked before
    anything starts, so a second ``reach up`` leaves the first one's hub and logs alone."""
    host = settings.server.host
    if _taken(host, port):
        return (
            f"port {port} on {host} is already in use (another `reach up` or `reach api`?); "
            f"stop it, or choose another port: reach up --port {port + 1}"
        )
    admin = settings.server.admin_port
    if admin is not None and _taken(host, admin):
        return f"the admin port {admin} (server.admin_port) on {host} is already in use"
    if demo_port is not None:
        for offset in range(len(DEMO_AGENTS)):
            if _taken("127.0.0.1", demo_port + offset):
                return (
                    f"demo agent port {demo_port + offset} is already in use; choose other "
                    f"ports with --demo-port N (uses N to N+{len(DEMO_AGENTS) - 1}) or --no-demo"
                )
    return None


def _taken(host: str, port: int) -> bool:
    """Whether binding ``host:port`` fails the way uvicorn's bind would (SO_REUSEADDR, so a
    port in TIME_WAIT after a stop counts as free)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror:
        return False  # the API will say what is wrong with the host
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError:
            return True
    return False


def examples_candidates() -> tuple[Path, ...]:
    """Where the demo agents may be, in order: the working directory's checkout, the
    checkout this package runs from (an editable install), and the environment's share
    folder, where the Docker image copies them (``COPY examples/agents/ …``)."""
    return (
        Path.cwd() / "examples" / "agents",
        Path(__file__).resolve().parents[2] / "examples" / "agents",
        Path(sys.prefix) / "share" / "agent-reach" / "examples" / "agents",
    )


def find_examples_dir() -> Path | None:
    for candidate in examples_candidates():
        if (candidate / DEMO_AGENTS[0][0]).exists():
            return candidate
    return None


def _die_with_me() -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the child get SIGTERM when this process dies (Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl  # libc, linked into python
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def in_child() -> None:  # between fork and exec: no allocation-heavy work here
        prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # the supervisor died before prctl took effect
            os._exit(1)

    return in_child


def _spawn(name: str, argv: list[str], env: dict[str, str], stage: int, logs: Path | None) -> Child:
    log = None if logs is None else logs / f"{name}.log"
    out: IO[bytes] | None = None if log is None else log.open("wb")
    try:
        proc = subprocess.Popen(
            argv,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=None if out is None else subprocess.STDOUT,
            start_new_session=True,  # Ctrl-C reaches the supervisor only: it stops them in order
            preexec_fn=_die_with_me(),  # safe after fork: `reach up` starts no threads
        )
    finally:
        if out is not None:
            out.close()  # the child holds its own descriptor
    return Child(name, proc, stage, log)


def _wait_healthy(hub_url: str, children: list[Child], stop: StopRequest, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and stop.signum is None:
        if any(c.proc.poll() is not None for c in children):
            return False
        try:
            if requests.get(f"{hub_url}/healthz", timeout=1).ok:
                return True
        except requests.RequestException:
            pass
        time.sleep(0.2)
    return False


def _terminate(children: list[Child], stop: StopRequest, grace: float = STOP_GRACE_S) -> list[str]:
    """Stop the children stage by stage (agents, then worker and beat, then the API), each
    stage given ``grace`` seconds after SIGTERM before its process groups are killed.

    Returns the names of those still running when their grace ran out (a demo agent
    killed so has not deregistered: worth a line on the terminal)."""
    overdue: list[str] = []
    for stage in sorted({c.stage for c in children}, reverse=True):
        group = [c for c in children if c.stage == stage and c.proc.poll() is None]
        for child in group:
            _signal_child(child, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while any(c.proc.poll() is None for c in group):
            if stop.hurry or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        if not stop.hurry:
            overdue += [c.name for c in group if c.proc.poll() is None]
        for child in group:
            # the whole group: a prefork worker's children too (it is its own session)
            _signal_child(child, signal.SIGKILL, group=True)
            child.proc.wait()
    for child in children:
        _signal_child(child, signal.SIGKILL, group=True)  # anything its leader left behind
    return overdue


def _signal_child(child: Child, signum: int, *, group: bool = False) -> None:
    try:
        if group:
            os.killpg(child.proc.pid, signum)
        elif child.proc.poll() is None:
            child.proc.send_signal(signum)
    except (ProcessLookupError, PermissionError):
        pass


def _fate(child: Child) -> str:
    code = child.proc.poll()
    if code is None:
        return "did not answer in time"
    if code < 0:
        return f"was killed by {signal.Signals(-code).name}"
    return f"exited with code {code}"


def _show_tail(screen: Screen, child: Child) -> None:
    """The last lines a failed child wrote, since its log is not on the terminal."""
    if child.log is None:
        return
    try:
        lines = child.log.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
    except OSError:
        return
    for line in lines:
        screen.say(f"  [dim]{escape(line)}[/dim]")
    screen.say(f"full log: {_shown_path(child.log)}")


def _shown_path(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _stores(settings: Settings) -> str:
    storage = settings.storage
    broker = storage.resolved_broker_url
    store = storage.resolved_database_url
    if store.startswith("sqlite"):
        store_kind = f"SQLite {_shown_path(Path(store.split(':///', 1)[-1]))}"
    else:
        store_kind = _kind(store).split("+", 1)[0]
    broker_kind = "embedded" if broker.startswith("sqla+") else _kind(broker)
    return f"store: {store_kind}, broker: {broker_kind}"


def _kind(url: str) -> str:
    return url.split("://", 1)[0]
