// A real hub for the agent tests: `reach db upgrade`, then `reach api` + `reach worker` +
// `reach beat` from the repo's venv (or $REACH_PYTHON), on a fresh SQLite store with the
// embedded broker, in a temp dir removed afterwards. Fast probe/sweep settings.
import { spawn, spawnSync } from "node:child_process";
import { mkdtempSync, openSync, readFileSync, rmSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

export const REPO = resolve(dirname(fileURLToPath(import.meta.url)), "..", "..", "..");
export const PYTHON = process.env.REACH_PYTHON || join(REPO, ".venv", "bin", "python");

export function freePort() {
  return new Promise((ok, fail) => {
    const srv = createServer();
    srv.once("error", fail);
    srv.listen(0, "127.0.0.1", () => {
      const { port } = srv.address();
      srv.close(() => ok(port));
    });
  });
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

export async function waitUntil(predicate, timeoutMs, what = "condition") {
  const deadline = Date.now() + timeoutMs;
  let last;
  while (Date.now() < deadline) {
    try {
      last = await predicate();
      if (last) return last;
    } catch (err) {
      last = err;
    }
    await sleep(100);
  }
  throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}: ${JSON.stringify(last)}`);
}

export async function startHub(extra = {}) {
  const home = mkdtempSync(join(tmpdir(), "reach-node-agent-"));
  const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith("REACH_")));
  Object.assign(env, {
    REACH_DATABASE_URL: `sqlite:///${join(home, "hub.db")}`,
    REACH_HOME: home,
    REACH_PROBE__INTERVAL: "0.5",
    REACH_PROBE__FAST_INTERVAL: "0.5",
    REACH_HEARTBEAT__SWEEP_INTERVAL: "0.5",
    // the test agents listen on loopback: a hub with auth on calls them only when told to
    REACH_SECURITY__ALLOW_LOOPBACK_AGENTS: "true",
    PYTHONUNBUFFERED: "1",
    ...extra,
  });
  const up = spawnSync(PYTHON, ["-m", "reach", "db", "upgrade"], { env, cwd: REPO, encoding: "utf8" });
  if (up.status !== 0) throw new Error(`reach db upgrade failed: ${up.stdout}${up.stderr}`);
  const port = await freePort();
  const procs = [];
  const logs = [];
  for (const [name, args] of [
    ["api", ["api", "--port", String(port)]],
    ["worker", ["worker", "--concurrency", "4"]],
    ["beat", ["beat"]],
  ]) {
    const log = join(home, `${name}.log`);
    const fd = openSync(log, "w");
    logs.push(log);
    procs.push(spawn(PYTHON, ["-m", "reach", ...args], { env, cwd: REPO, stdio: ["ignore", fd, fd], detached: true }));
  }
  const url = `http://127.0.0.1:${port}`;
  const output = () => logs.map((l) => `== ${l}\n${readFileSync(l, "utf8")}`).join("\n");
  const stop = async () => {
    for (const p of procs) {
      try {
        process.kill(-p.pid, "SIGTERM");
      } catch {}
    }
    await Promise.all(
      procs.map(
        (p) =>
          new Promise((r) => {
            if (p.exitCode !== null || p.signalCode !== null) return r();
            const t = setTimeout(() => {
              try {
                process.kill(-p.pid, "SIGKILL");
              } catch {}
              r();
            }, 8000);
            p.once("exit", () => (clearTimeout(t), r()));
          }),
      ),
    );
    rmSync(home, { recursive: true, force: true });
  };
  try {
    await waitUntil(async () => (await fetch(url + "/healthz")).ok, 30_000, "the hub's /healthz");
  } catch (err) {
    const out = output();
    await stop();
    throw new Error(`${err.message}\n${out}`);
  }
  const get = async (path) => {
    const r = await fetch(url + path);
    return { status: r.status, body: await r.json() };
  };
  return {
    url,
    home,
    env,
    output,
    stop,
    get,
    /** The instances of an agent the hub knows (deregistered ones included). */
    async instances(agentId) {
      const r = await get(`/api/v1/agents/${agentId}`);
      return r.status === 200 ? r.body.instances : [];
    },
    async submit(body) {
      const r = await fetch(url + "/v1/tasks", {
        method: "POST",
        headers: { "Content-Type": "application/json" },
        body: JSON.stringify(body),
      });
      const answer = await r.json();
      if (r.status >= 300) throw new Error(`submit refused: ${r.status} ${JSON.stringify(answer)}`);
      return answer.task_id;
    },
    /** The task's view once terminal (long-polls the hub). */
    async result(taskId, timeoutMs = 20_000) {
      return waitUntil(
        async () => {
          const r = await get(`/v1/tasks/${taskId}?wait=5`);
          return ["success", "failed", "dead", "cancelled"].includes(r.body.status) ? r.body : null;
        },
        timeoutMs,
        `task ${taskId} to finish`,
      );
    },
    async events(taskId) {
      return (await get(`/v1/tasks/${taskId}/events`)).body.events;
    },
  };
}

/** Run Python code in the repo's venv against `hub` (REACH_HUB_URL set); its stdout. */
export function python(hub, code, timeoutMs = 60_000) {
  return new Promise((ok, fail) => {
    const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith("REACH_")));
    env.REACH_HUB_URL = hub;
    const p = spawn(PYTHON, ["-c", code], { env, cwd: REPO });
    let out = "";
    let err = "";
    p.stdout.on("data", (d) => (out += d));
    p.stderr.on("data", (d) => (err += d));
    const t = setTimeout(() => p.kill("SIGKILL"), timeoutMs);
    p.on("exit", (code) => {
      clearTimeout(t);
      if (code === 0) ok(out);
      else fail(new Error(`python exited ${code}:\n${err}`));
    });
  });
}
