// The Node agent against a hub that requires API keys: its key rides on registration, the
// heartbeat thread and the channel; a wrong key fails start() at once.
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { after, before, test } from "node:test";

import { Agent, Forbidden, Unauthenticated } from "../dist/index.js";
import { PYTHON, REPO, freePort, startHub, waitUntil } from "./agent-harness.mjs";

let hub;
let admin;
let agentKey;
const cleanup = [];
const UNKNOWN_KEY = `rk_0123456789abcdef_${"A".repeat(43)}`; // well-formed, never issued

function createKey(...args) {
  const r = spawnSync(PYTHON, ["-m", "reach", "keys", "create", "--json", ...args], { env: hub.env, cwd: REPO, encoding: "utf8" });
  assert.equal(r.status, 0, r.stderr);
  return JSON.parse(r.stdout.trim().split("\n").pop()).secret;
}

before(async () => {
  hub = await startHub({ REACH_SECURITY__REQUIRE_AUTH: "true" });
  admin = createKey("--scope", "admin");
  agentKey = createKey("--scope", "agent", "--agent-id", "node-auth*");
});

after(async () => {
  for (const fn of cleanup.reverse()) await fn().catch(() => {});
  if (hub) await hub.stop();
});

const asAdmin = { Authorization: () => `Bearer ${admin}` };
async function instances(agentId) {
  const r = await fetch(`${hub.url}/api/v1/agents/${agentId}`, { headers: { Authorization: asAdmin.Authorization() } });
  return r.status === 200 ? (await r.json()).instances : [];
}
async function submit(body) {
  const r = await fetch(`${hub.url}/v1/tasks`, {
    method: "POST",
    headers: { "Content-Type": "application/json", Authorization: asAdmin.Authorization() },
    body: JSON.stringify(body),
  });
  assert.ok(r.status < 300, await r.clone().text());
  return (await r.json()).task_id;
}
async function result(taskId) {
  return waitUntil(
    async () => {
      const r = await fetch(`${hub.url}/v1/tasks/${taskId}?wait=5`, { headers: { Authorization: asAdmin.Authorization() } });
      const view = await r.json();
      return ["success", "failed", "dead", "cancelled"].includes(view.status) ? view : null;
    },
    20_000,
    `task ${taskId}`,
  );
}

test("a wrong key, or another agent's, fails start() at once, and the port is let go", async () => {
  const port = await freePort();
  const opts = { addr: `127.0.0.1:${port}`, hub: hub.url, allowLoopback: true, heartbeatInterval: 300 };
  const wrong = new Agent({ agentId: "node-auth-x", apiKey: UNKNOWN_KEY, ...opts });
  cleanup.push(() => wrong.close());
  await assert.rejects(wrong.start(), Unauthenticated);
  const other = new Agent({ agentId: "other-agent", apiKey: agentKey, ...opts }); // the same port: it was freed
  cleanup.push(() => other.close());
  await assert.rejects(other.start(), Forbidden);
  const channel = new Agent({ agentId: "node-auth-x", channel: true, hub: hub.url, apiKey: UNKNOWN_KEY });
  cleanup.push(() => channel.close());
  await assert.rejects(channel.start(), Unauthenticated);
});

test("with its key the agent registers, heartbeats from its thread and takes a task", async () => {
  const port = await freePort();
  const agent = new Agent({ agentId: "node-auth", addr: `127.0.0.1:${port}`, hub: hub.url, apiKey: agentKey, heartbeatInterval: 300, allowLoopback: true });
  agent.route("echo", (_t, payload) => payload);
  cleanup.push(() => agent.close());
  await agent.start();
  await waitUntil(
    async () => (await instances("node-auth")).find((i) => i.status === "online" && i.heartbeat_count >= 2),
    15_000,
    "node-auth online with heartbeats",
  );
  const view = await result(await submit({ agent_id: "node-auth", method: "echo", payload: { k: 1 } }));
  assert.deepEqual(view.result, { k: 1 });
  await agent.close();
  assert.ok((await instances("node-auth")).every((i) => i.status === "deregistered"));
});

test("a channel agent with its key takes a task over the WebSocket", async () => {
  const agent = new Agent({ agentId: "node-auth-ch", hub: hub.url, apiKey: agentKey, heartbeatInterval: 300 });
  agent.route("echo", (_t, payload) => ({ channel: payload }));
  cleanup.push(() => agent.close());
  await agent.start();
  const view = await result(await submit({ agent_id: "node-auth-ch", method: "echo", payload: { c: 2 } }));
  assert.deepEqual(view.result, { channel: { c: 2 } });
});
