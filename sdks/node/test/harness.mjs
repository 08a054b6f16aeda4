// A real hub for the Node SDK's tests: `reach db upgrade`, then `reach api`, `reach worker`
// and `reach beat` on SQLite with the embedded broker in a temporary REACH_HOME, each in
// its own process group (stopped as a group: no orphans), plus Python agents.
//
// The Python comes from $REACH_PYTHON, else the repository's .venv (../../.venv).

import { spawn, spawnSync } from "node:child_process";
import { closeSync, existsSync, mkdtempSync, openSync, readFileSync, rmSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

export const NODE_ROOT = resolve(dirname(fileURLToPath(import.meta.url)), "..");
export const REPO = resolve(NODE_ROOT, "..", "..");

export function python() {
  const py = process.env.REACH_PYTHON || join(REPO, ".venv", "bin", "python");
  if (!existsSync(py)) throw new Error(`no Python at ${py}: set REACH_PYTHON to a venv with agent-reach`);
  return py;
}

/** A TCP port nobody listens on right now. */
export function freePort() {
  return new Promise((ok, fail) => {
    const srv = createServer();
    srv.unref();
    srv.on("error", fail);
    srv.listen(0, "127.0.0.1", () => {
      const { port } = srv.address();
      srv.close(() => ok(port));
    });
  });
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** Poll `predicate` (async) until truthy; its value. */
export async function waitUntil(predicate, { timeoutMs = 20_000, intervalMs = 100, what = "condition" } = {}) {
  const deadline = Date.now() + timeoutMs;
  let last;
  while (Date.now() < deadline) {
    try {
      last = await predicate();
      if (last) return last;
    } catch (exc) {
      last = exc;
    }
    await sleep(intervalMs);
  }
  throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}: ${last}`);
}

/** The environment of a hub: ours without any REACH_* variable, plus the store. */
function hubEnv(home, extra) {
  const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith("REACH_")));
  return {
    ...env,
    REACH_HOME: home,
    REACH_DATABASE_URL: `sqlite:///${join(home, "reach.db")}`,
    // the test agents listen on loopback: a hub with auth on calls them only when told to
    REACH_SECURITY__ALLOW_LOOPBACK_AGENTS: "true",
    PYTHONUNBUFFERED: "1",
    ...extra,
  };
}

class Proc {
  constructor(name, args, { env, cwd, log }) {
    this.name = name;
    this.log = log;
    const fd = openSync(log, "a");
    this.child = spawn(args[0], args.slice(1), { env, cwd, stdio: ["ignore", fd, fd], detached: true });
    closeSync(fd);
    this.exited = new Promise((r) => this.child.once("exit", (code, signal) => r({ code, signal })));
    this.exitCode = null;
    this.child.once("exit", (code, signal) => (this.exitCode = code ?? signal));
  }

  output() {
    try {
      return readFileSync(this.log, "utf8");
    } catch {
      return "";
    }
  }

  /** SIGTERM the process group; SIGKILL it if it has not left within `graceMs`. */
  async stop(graceMs = 3_000) {
    const pid = this.child.pid;
    if (pid === undefined) return;
    const group = (sig) => {
      try {
        process.kill(-pid, sig);
      } catch {
        /* already gone */
      }
    };
    if (this.exitCode === null) {
      group("SIGTERM");
      const left = await Promise.race([this.exited, sleep(graceMs).then(() => "timeout")]);
      if (left === "timeout") group("SIGKILL");
      await Promise.race([this.exited, sleep(2_000)]);
    }
    group("SIGKILL"); // any child the leader left behind
  }
}

const live = new Set();
process.once("exit", () => {
  for (const p of live) {
    try {
      process.kill(-p.child.pid, "SIGKILL");
    } catch {
      /* gone */
    }
  }
});

/**
 * Start a hub. `extra`: more env (e.g. `REACH_SECURITY__REQUIRE_AUTH: "true"`);
 * `worker`/`beat`: whether to start them (default true). Returns a `Hub`.
 */
export async function startHub({ extra = {}, worker = true, beat = true } = {}) {
  const home = mkdtempSync(join(tmpdir(), "reach-node-"));
  const env = hubEnv(home, extra);
  const py = python();
  const upgrade = spawnSync(py, ["-m", "reach", "db", "upgrade"], { env, cwd: REPO, encoding: "utf8" });
  if (upgrade.status !== 0) throw new Error(`reach db upgrade failed:\n${upgrade.stdout}${upgrade.stderr}`);
  const port = await freePort();
  const hub = new Hub(`http://127.0.0.1:${port}`, home, env);
  hub.spawn("api", [py, "-m", "reach", "api", "--port", String(port)]);
  if (worker) hub.spawn("worker", [py, "-m", "reach", "worker", "--concurrency", "2"]);
  if (beat) hub.spawn("beat", [py, "-m", "reach", "beat"]);
  try {
    await waitUntil(
      async () => {
        const api = hub.procs[0];
        if (api.exitCode !== null) throw new Error(`reach api exited:\n${api.output()}`);
        const r = await fetch(hub.url + "/healthz", { signal: AbortSignal.timeout(1_000) });
        return r.ok;
      },
      { timeoutMs: 30_000, what: `${hub.url}/healthz` },
    );
  } catch (exc) {
    await hub.stop();
    throw new Error(`${exc.message}\n${hub.procs[0]?.output() ?? ""}`);
  }
  return hub;
}

export class Hub {
  constructor(url, home, env) {
    this.url = url;
    this.home = home;
    this.env = env;
    this.procs = [];
  }

  spawn(name, args, env = this.env) {
    const p = new Proc(name, args, { env, cwd: REPO, log: join(this.home, `${name}.log`) });
    this.procs.push(p);
    live.add(p);
    return p;
  }

  /** `reach <args>` against this hub's store; its stdout (throws on a non-zero exit). */
  reach(args) {
    const r = spawnSync(python(), ["-m", "reach", ...args], { env: this.env, cwd: REPO, encoding: "utf8" });
    if (r.status !== 0) throw new Error(`reach ${args.join(" ")} failed (${r.status}):\n${r.stdout}${r.stderr}`);
    return r.stdout;
  }

  /** A new API key of `scope`: its secret. */
  createKey(scope, name = `node-${scope}`) {
    const out = JSON.parse(this.reach(["keys", "create", "--scope", scope, "--name", name, "--json"]));
    return out.key ?? out.secret ?? out.api_key;
  }

  /** Start `test/agents/echo_agent.py` as `agentId` (with `tags`); resolves once routable. */
  async startAgent(agentId, tags = []) {
    const port = await freePort();
    const args = [python(), join(NODE_ROOT, "test", "agents", "echo_agent.py"), "--port", String(port)];
    args.push("--hub", this.url, "--agent-id", agentId);
    for (const t of tags) args.push("--tag", t);
    const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith("REACH_")));
    const p = this.spawn(`agent-${agentId}`, args, { ...env, PYTHONUNBUFFERED: "1" });
    await waitUntil(
      async () => {
        if (p.exitCode !== null) throw new Error(`agent ${agentId} exited:\n${p.output()}`);
        const r = await fetch(`${this.url}/api/v1/agents/${agentId}`, { signal: AbortSignal.timeout(1_000) });
        if (!r.ok) return false;
        const body = await r.json();
        return JSON.stringify(body).includes('"online"');
      },
      { timeoutMs: 20_000, what: `agent ${agentId} online` },
    );
    return p;
  }

  async stop() {
    await Promise.all(
      [...this.procs].reverse().map(async (p) => {
        await p.stop();
        live.delete(p);
      }),
    );
    if (!process.env.REACH_NODE_KEEP_HOME) rmSync(this.home, { recursive: true, force: true });
  }
}
