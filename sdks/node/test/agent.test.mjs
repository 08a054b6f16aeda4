// The Node agent against a real hub (api + worker + beat on SQLite, embedded broker):
// registration, heartbeats, probes, tasks from Python, 202 then report, progress, dedup,
// 429, reach tokens refused, SIGTERM, the channel, a mounted handler, a long handler reported.
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { generateKeyPairSync, randomUUID, sign } from "node:crypto";
import { createServer } from "node:http";
import { join } from "node:path";
import { Readable } from "node:stream";
import { after, before, test } from "node:test";

import { ACCEPTED, Agent } from "../dist/index.js";
import { BusinessError } from "../dist/errors.js";
import { REPO, freePort, python, sleep, startHub, waitUntil } from "./agent-harness.mjs";

let hub;
const cleanup = [];

before(async () => {
  hub = await startHub();
});

after(async () => {
  for (const fn of cleanup.reverse()) await fn().catch(() => {});
  if (hub) await hub.stop();
});

/** `script` as a child Node process (ES module); its output kept, SIGKILLed at cleanup. */
function runScript(script) {
  const child = spawn(process.execPath, ["--input-type=module", "-e", script], { stdio: ["ignore", "pipe", "pipe"] });
  let out = "";
  child.stdout.on("data", (d) => (out += d));
  child.stderr.on("data", (d) => (out += d));
  const exited = new Promise((r) => child.once("exit", (code, signal) => r({ code, signal })));
  cleanup.push(async () => child.kill("SIGKILL"));
  return { child, exited, output: () => out };
}

/** A node:http server mounting `agent.handler()` under /reach, keeping each delivery. */
async function mount(agent, port) {
  const seen = [];
  const handle = agent.handler();
  const server = createServer(async (req, res) => {
    if (!req.url.startsWith("/reach")) {
      res.writeHead(404).end();
      return;
    }
    const chunks = [];
    for await (const c of req) chunks.push(c);
    const raw = Buffer.concat(chunks);
    if (req.method === "POST") seen.push({ url: req.url, headers: { ...req.headers }, raw });
    // Express-style: the handler reads a request object (here one re-made from the bytes)
    const copy = Object.assign(Readable.from([raw]), { url: req.url, method: req.method, headers: req.headers });
    handle(copy, res, () => res.writeHead(418).end());
  });
  await new Promise((r) => server.listen(port, "127.0.0.1", r));
  cleanup.push(() => new Promise((r) => (server.closeAllConnections(), server.close(() => r()))));
  return { server, seen };
}

async function post(url, body, headers = {}) {
  const r = await fetch(url, {
    method: "POST",
    headers: { "Content-Type": "application/json", ...headers },
    body: typeof body === "string" ? body : JSON.stringify(body),
  });
  return { status: r.status, body: await r.json() };
}

// -- the main agent, mounted under /reach on a server of the test's own ------------------
const counts = new Map();
const traces = new Map();
const bump = (key) => counts.set(key, (counts.get(key) ?? 0) + 1);
let agentA;
let portA;
let mountA;

async function startA() {
  if (agentA) return;
  portA = await freePort();
  agentA = new Agent({
    agentId: "node-a",
    tags: ["node", "test"],
    addr: `http://127.0.0.1:${portA}/reach`,
    capabilities: [
      { type: "echo", description: "echoes its payload" },
      { type: "later", description: "answers 202, reports later" },
      { type: "refuse", description: "a business error" },
    ],
    maxConcurrency: 4,
    heartbeatInterval: 500,
    hub: hub.url,
    allowLoopback: true,
  });
  agentA.route("echo", (taskId, payload, delivery) => {
    bump(`echo:${taskId}`);
    traces.set(taskId, delivery.childTrace);
    return { echo: payload };
  });
  agentA.route("later", (taskId, payload, delivery) => {
    bump(`later:${taskId}`);
    setTimeout(async () => {
      await agentA.reportProgress(taskId, 0.25, "a quarter");
      await agentA.reportProgress(taskId, 0.75, "three quarters");
      await agentA.reportResult(taskId, { later: payload, attempt: delivery.attemptSeq });
    }, 300);
    return ACCEPTED;
  });
  agentA.route("refuse", () => {
    throw new BusinessError(42, "not today");
  });
  mountA = await mount(agentA, portA);
  await agentA.join();
  cleanup.push(() => agentA.close());
}

test("registers, heartbeats and is probed online", async () => {
  await startA();
  const inst = await waitUntil(
    async () => {
      const [i] = await hub.instances("node-a");
      // the agent counts a heartbeat when its answer reaches the main thread, which can be
      // after the hub has stored it: wait for both sides rather than read one after the other
      const both = i && i.heartbeat_count >= 2 && agentA.heartbeats >= 2;
      return both && i.status === "online" && i.probe_status === "ok" ? i : null;
    },
    20_000,
    "node-a online with heartbeats (counted by hub and agent) and probes",
  );
  assert.equal(inst.instance_id, agentA.instanceId);
  assert.equal(inst.endpoint, `http://127.0.0.1:${portA}/reach`);
  const view = (await hub.get("/api/v1/agents/node-a")).body;
  assert.deepEqual(view.tags, ["node", "test"]);
  assert.equal(view.capabilities[0].type, "echo");
  const health = await fetch(`http://127.0.0.1:${portA}/reach/healthz`).then((r) => r.json());
  assert.equal(health.instance_id, agentA.instanceId);
});

test("a task sent from Python gets the sync answer and a 202-then-report result", async () => {
  await startA();
  const out = await python(
    hub.url,
    `
import json, reach
a = reach.send(method="echo", agent_id="node-a", payload={"x": 1})
ra = reach.wait_for_result(a.task_id, timeout=30)
b = reach.send(method="later", agent_id="node-a", payload={"y": 2})
rb = reach.wait_for_result(b.task_id, timeout=30)
c = reach.send(method="refuse", agent_id="node-a", payload={})
try:
    reach.wait_for_result(c.task_id, timeout=30)
    rc = None
except reach.BusinessError as exc:
    rc = [exc.code, exc.message]
print(json.dumps({"a": [a.task_id, ra.data], "b": [b.task_id, rb.data], "c": rc}))
`,
  );
  const got = JSON.parse(out.trim().split("\n").pop());
  assert.deepEqual(got.a[1], { echo: { x: 1 } });
  assert.deepEqual(got.b[1], { later: { y: 2 }, attempt: 1 });
  assert.deepEqual(got.c, [42, "not today"]);
  assert.equal(counts.get(`echo:${got.a[0]}`), 1);
  assert.deepEqual(traces.get(got.a[0]), { root_id: got.a[0], parent_task_id: got.a[0], hops: 1, path: ["node-a"] });
  assert.equal(counts.get(`later:${got.b[0]}`), 1);
  const events = await hub.events(got.b[0]);
  const progress = events.filter((e) => e.kind === "progress").map((e) => [e.detail.progress, e.detail.message]);
  assert.deepEqual(progress, [
    [0.25, "a quarter"],
    [0.75, "three quarters"],
  ]);
  assert.ok(events.some((e) => e.kind === "terminal_success" && e.detail.reported_by === agentA.instanceId));
});

test("a replayed delivery is refused 401 and the handler does not run again", async () => {
  await startA();
  const taskId = await hub.submit({ agent_id: "node-a", method: "echo", payload: { z: 3 } });
  const view = await hub.result(taskId);
  assert.equal(view.status, "success");
  const captured = mountA.seen.find((d) => d.raw.toString().includes(taskId));
  assert.ok(captured, "the hub's delivery reached the mount");
  assert.match(captured.headers.authorization, /^Bearer ey/);
  const again = await post(`http://127.0.0.1:${portA}${captured.url}`, captured.raw.toString(), {
    Authorization: captured.headers.authorization,
  });
  assert.equal(again.status, 401);
  assert.match(again.body.message, /replayed jti/);
  assert.equal(counts.get(`echo:${taskId}`), 1);

  // the same token with another payload, or on another method: the token binds both
  const forged = captured.raw.toString().replace('"z":3', '"z":3000');
  assert.notEqual(forged, captured.raw.toString());
  const otherBody = await post(`http://127.0.0.1:${portA}${captured.url}`, forged, {
    Authorization: captured.headers.authorization,
  });
  assert.equal(otherBody.status, 401);
  assert.match(otherBody.body.message, /signed for another body/);
  const otherMethod = await post(
    `http://127.0.0.1:${portA}${captured.url.replace("/tasks/echo", "/tasks/later")}`,
    captured.raw.toString(),
    { Authorization: captured.headers.authorization },
  );
  assert.equal(otherMethod.status, 401);
  assert.match(otherMethod.body.message, /another method/);
  assert.equal(counts.get(`echo:${taskId}`), 1);

  // the same, genuine token shown to another agent: not its audience
  const portB = await freePort();
  const agentB = new Agent({ agentId: "node-b", addr: `127.0.0.1:${portB}`, hub: hub.url, allowLoopback: true });
  let ranB = 0;
  agentB.route("echo", () => (ranB += 1));
  const server = createServer(agentB.handler());
  await new Promise((r) => server.listen(portB, "127.0.0.1", r));
  cleanup.push(() => new Promise((r) => (server.closeAllConnections(), server.close(() => r()))));
  const wrongAgent = await post(`http://127.0.0.1:${portB}/tasks/echo`, captured.raw.toString(), {
    Authorization: captured.headers.authorization,
  });
  assert.equal(wrongAgent.status, 401);
  assert.match(wrongAgent.body.message, /meant for another agent/);
  assert.equal(ranB, 0);
});

test("forged, expired or missing tokens get 401 and the handler never runs", async () => {
  await startA();
  const jwks = (await hub.get("/.well-known/jwks.json")).body;
  const hubKid = jwks.keys[0].kid;
  const { privateKey } = generateKeyPairSync("ed25519"); // a key the hub never published
  const b64 = (o) => Buffer.from(JSON.stringify(o)).toString("base64url");
  const mint = (claims, kid = hubKid) => {
    const h = b64({ alg: "EdDSA", typ: "JWT", kid });
    const p = b64(claims);
    return `${h}.${p}.${sign(null, Buffer.from(`${h}.${p}`), privateKey).toString("base64url")}`;
  };
  const now = Math.floor(Date.now() / 1000);
  const before = counts.size;
  const cases = [
    [null, /no reach token/],
    ["Bearer garbage", /malformed/],
    [mint({ iss: "reach", sub: "t", aud: "node-a", task_id: "forged-1", attempt_seq: 1, iat: now, exp: now + 60, jti: randomUUID() }), /signature does not verify/],
    [mint({ iss: "reach", sub: "t", aud: "node-b", task_id: "forged-1", attempt_seq: 1, iat: now, exp: now + 60, jti: randomUUID() }), /signature does not verify/],
    [mint({ iss: "reach", sub: "t", aud: "node-a", task_id: "forged-1", attempt_seq: 1, iat: now - 900, exp: now - 600, jti: randomUUID() }), /signature does not verify/],
    [mint({ iss: "reach", sub: "t", aud: "node-a", task_id: "forged-1", attempt_seq: 1, iat: now, exp: now + 60, jti: randomUUID() }, "not-the-hubs"), /does not publish|does not know/],
  ];
  for (const [token, reason] of cases) {
    const headers = token === null ? {} : { Authorization: token.startsWith("Bearer") ? token : `Bearer ${token}` };
    const r = await post(`http://127.0.0.1:${portA}/reach/tasks/echo`, { task_id: "forged-1", attempt_seq: 1, payload: {} }, headers);
    assert.ok([401, 503].includes(r.status), `${r.status} ${JSON.stringify(r.body)}`);
    if (!/does not know/.test(r.body.message)) assert.equal(r.status, 401);
    assert.match(r.body.message, reason);
  }
  assert.equal(counts.get("echo:forged-1"), undefined);
  assert.equal(counts.size, before);
});

// -- an agent without a hub (tokens off), reached over HTTP directly ---------------------
test("a duplicate delivery of one task_id runs the handler once; past maxConcurrency 429", async () => {
  const port = await freePort();
  const agent = new Agent({ agentId: "node-c", addr: `127.0.0.1:${port}`, maxConcurrency: 1, verifyTokens: false, hub: hub.url, allowLoopback: true });
  let runs = 0;
  let release;
  const gate = new Promise((r) => (release = r));
  agent.route("slow", async (taskId) => {
    runs += 1;
    await gate;
    return { ran: taskId };
  });
  const server = createServer(agent.handler());
  await new Promise((r) => server.listen(port, "127.0.0.1", r));
  cleanup.push(() => new Promise((r) => (server.closeAllConnections(), server.close(() => r()))));
  const url = `http://127.0.0.1:${port}/tasks/slow`;
  const first = post(url, { task_id: "dup-1", attempt_seq: 1, payload: {} });
  await waitUntil(() => runs === 1, 5000, "the first copy to start");
  const duplicate = post(url, { task_id: "dup-1", attempt_seq: 2, payload: {} }); // waits for the first
  const other = await post(url, { task_id: "other-1", attempt_seq: 1, payload: {} });
  assert.equal(other.status, 429);
  assert.equal(other.body.code, 429);
  release();
  const [a, b] = await Promise.all([first, duplicate]);
  assert.deepEqual([a.status, a.body], [200, { code: 0, data: { ran: "dup-1" } }]);
  assert.deepEqual([b.status, b.body], [200, { code: 0, data: { ran: "dup-1" } }]);
  const later = await post(url, { task_id: "dup-1", attempt_seq: 3, payload: {} });
  assert.deepEqual(later.body, { code: 0, data: { ran: "dup-1" } });
  assert.equal(runs, 1);
  // the refused task was not remembered: it runs once a slot is free
  const retried = await post(url, { task_id: "other-1", attempt_seq: 2, payload: {} });
  assert.equal(retried.status, 200);
  assert.equal(runs, 2);
  const bad = await post(url, "not json");
  assert.equal(bad.status, 400);
  assert.equal((await post(`http://127.0.0.1:${port}/tasks/nope`, { task_id: "x", payload: {} })).status, 404);
});

test("without a heartbeat thread (the fallback) heartbeats run on the main thread", async () => {
  const port = await freePort();
  const agent = new Agent({ agentId: "node-inthread", addr: `127.0.0.1:${port}`, heartbeatInterval: 300, hub: hub.url, allowLoopback: true });
  cleanup.push(() => agent.close());
  agent.startHeartbeat({ thread: false });
  await agent.start();
  assert.equal(agent.heartbeatThread, false);
  await waitUntil(
    async () =>
      agent.heartbeats >= 2 &&
      (await hub.instances("node-inthread")).find((i) => i.status === "online" && i.heartbeat_count >= 2),
    15_000,
    "node-inthread heartbeating (counted by hub and agent)",
  );
  await agent.close();
  const seen = agent.heartbeats;
  await sleep(700);
  assert.equal(agent.heartbeats, seen); // stopped with close()
  assert.ok((await hub.instances("node-inthread")).every((i) => i.status === "deregistered"));
});

test("channel mode: an agent with no addr takes a task over the WebSocket", async () => {
  const agent = new Agent({ agentId: "node-ch", channel: true, heartbeatInterval: 500, hub: hub.url });
  let runs = 0;
  agent.route("echo", (taskId, payload) => {
    runs += 1;
    return { via: "channel", payload };
  });
  await agent.start();
  cleanup.push(() => agent.close());
  await waitUntil(
    async () => (await hub.instances("node-ch")).some((i) => i.status === "online" && i.instance_id === agent.instanceId),
    15_000,
    "node-ch online",
  );
  const taskId = await hub.submit({ agent_id: "node-ch", method: "echo", payload: { n: 7 } });
  const view = await hub.result(taskId);
  assert.equal(view.status, "success", JSON.stringify(view));
  assert.deepEqual(view.result, { via: "channel", payload: { n: 7 } });
  assert.equal(runs, 1);
  await agent.close();
  await waitUntil(
    async () => (await hub.instances("node-ch")).every((i) => i.status === "deregistered"),
    10_000,
    "node-ch deregistered on close",
  );
});

test("a handler longer than acceptAfterMs ends its task by the SDK's report, over HTTP and the channel", async () => {
  let runs = 0;
  const think = async (taskId, payload) => {
    runs += 1;
    await sleep(2_500);
    return { thought: payload.q };
  };
  const port = await freePort();
  const http = new Agent({ agentId: "node-think", addr: `127.0.0.1:${port}`, heartbeatInterval: 500, hub: hub.url, allowLoopback: true, acceptAfterMs: 300 });
  const natted = new Agent({ agentId: "node-think-ch", channel: true, heartbeatInterval: 500, hub: hub.url, acceptAfterMs: 300 });
  for (const agent of [http, natted]) {
    agent.route("think", think);
    await agent.start();
    cleanup.push(() => agent.close());
    await waitUntil(
      async () => (await hub.instances(agent.agentId)).some((i) => i.status === "online" && i.instance_id === agent.instanceId),
      15_000,
      `${agent.agentId} online`,
    );
  }
  for (const agent of [http, natted]) {
    const taskId = await hub.submit({ agent_id: agent.agentId, method: "think", payload: { q: agent.agentId } });
    const view = await hub.result(taskId, 30_000);
    assert.equal(view.status, "success", JSON.stringify(view));
    assert.deepEqual(view.result, { thought: agent.agentId });
    const events = await hub.events(taskId);
    assert.ok(events.some((e) => e.kind === "ack"), "answered 202");
    assert.ok(events.some((e) => e.kind === "terminal_success" && e.detail.reported_by === agent.instanceId));
  }
  assert.equal(runs, 2);
  await Promise.all([http.close(), natted.close()]);
});

test("heartbeats go on while a handler blocks the event loop; SIGTERM deregisters", async () => {
  const port = await freePort();
  const script = `
    import { Agent } from ${JSON.stringify(join(REPO, "sdks/node/dist/index.js"))};
    const agent = new Agent({ agentId: "node-busy", addr: "127.0.0.1:${port}", heartbeatInterval: 300,
      hub: ${JSON.stringify(hub.url)}, allowLoopback: true });
    agent.route("block", (taskId, payload) => {
      const until = Date.now() + payload.ms;
      while (Date.now() < until) {} // business code hogging the event loop
      return { blocked: payload.ms };
    });
    await agent.serve();
    console.log("closed");
  `;
  const { child, exited, output } = runScript(script);
  const inst = await waitUntil(
    async () => (await hub.instances("node-busy")).find((i) => i.status === "online"),
    20_000,
    "node-busy online",
  );
  const taskId = await hub.submit({ agent_id: "node-busy", method: "block", payload: { ms: 4000 } });
  // only the heartbeat thread can say in_flight=1 while the main loop is blocked
  const busy = await waitUntil(
    async () => (await hub.instances("node-busy")).find((i) => i.in_flight === 1),
    10_000,
    "a heartbeat reporting the task in flight",
  ).catch(async (err) => {
    throw new Error(`${err.message}\n${output()}\n${JSON.stringify(await hub.events(taskId))}\n${JSON.stringify(await hub.instances("node-busy"))}`);
  });
  const beats = busy.heartbeat_count;
  const still = await waitUntil(
    async () => (await hub.instances("node-busy")).find((i) => i.in_flight === 1 && i.heartbeat_count >= beats + 2),
    3_000,
    "more heartbeats while the handler blocks",
  );
  assert.equal(still.status, "online");
  const view = await hub.result(taskId);
  assert.deepEqual(view.result, { blocked: 4000 });
  child.kill("SIGTERM");
  const { code } = await exited;
  assert.equal(code, 0, output());
  assert.match(output(), /closed/);
  const [after] = (await hub.instances("node-busy")).filter((i) => i.instance_id === inst.instance_id);
  assert.equal(after.status, "deregistered");
});

test("examples/node/echo-agent.mjs runs against the hub", async () => {
  const port = await freePort();
  const child = spawn(process.execPath, [join(REPO, "examples/node/echo-agent.mjs")], {
    env: { ...process.env, REACH_HUB_URL: hub.url, ECHO_PORT: String(port), ECHO_AGENT_ID: "node-echo-example", ECHO_HEARTBEAT: "500" },
    stdio: ["ignore", "pipe", "pipe"],
  });
  let out = "";
  child.stdout.on("data", (d) => (out += d));
  child.stderr.on("data", (d) => (out += d));
  const exited = new Promise((r) => child.once("exit", (code) => r(code)));
  cleanup.push(async () => child.kill("SIGKILL"));
  await waitUntil(async () => (await hub.instances("node-echo-example")).some((i) => i.status === "online"), 20_000, "example online");
  const a = await hub.submit({ agent_id: "node-echo-example", method: "echo", payload: { hi: 1 } });
  const b = await hub.submit({ agent_id: "node-echo-example", method: "slow.echo", payload: { hi: 2, delay_ms: 100 } });
  assert.deepEqual((await hub.result(a)).result.echo, { hi: 1 });
  assert.deepEqual((await hub.result(b)).result, { echo: { hi: 2, delay_ms: 100 }, later: true });
  child.kill("SIGTERM");
  assert.equal(await exited, 0, out);
  assert.ok((await hub.instances("node-echo-example")).every((i) => i.status === "deregistered"));
});

/** A proxy in front of the hub forwarding everything, holding the hub's answers to
 * `heldPath` (the hub has acted; the agent does not know yet) until `release()`. */
async function holdingProxy(heldPath) {
  const seen = [];
  let release;
  const released = new Promise((r) => (release = r));
  let arrived;
  const arrival = new Promise((r) => (arrived = r));
  const server = createServer(async (req, res) => {
    seen.push(`${req.method} ${req.url}`);
    const chunks = [];
    for await (const c of req) chunks.push(c);
    const headers = { ...req.headers };
    delete headers.host;
    delete headers["content-length"];
    delete headers.connection;
    const answer = await fetch(hub.url + req.url, {
      method: req.method,
      headers,
      body: req.method === "GET" ? undefined : Buffer.concat(chunks),
    });
    const body = Buffer.from(await answer.arrayBuffer());
    if (req.url === heldPath) {
      arrived();
      await released;
    }
    res.writeHead(answer.status, { "content-type": answer.headers.get("content-type") ?? "application/json" });
    res.end(body);
  });
  const port = await freePort();
  await new Promise((r) => server.listen(port, "127.0.0.1", r));
  cleanup.push(async () => {
    release();
    server.closeAllConnections();
    await new Promise((r) => server.close(r));
  });
  return { url: `http://127.0.0.1:${port}`, seen, arrival, release };
}

test("SIGTERM before the registration answer arrives: the agent deregisters and exits 0", async () => {
  const proxy = await holdingProxy("/v1/agents/register");
  const port = await freePort();
  const script = `
    import { Agent } from ${JSON.stringify(join(REPO, "sdks/node/dist/index.js"))};
    const agent = new Agent({ agentId: "node-early-stop", addr: "127.0.0.1:${port}", heartbeatInterval: 5000,
      hub: ${JSON.stringify(proxy.url)}, allowLoopback: true });
    await agent.serve();
    console.log("closed");
  `;
  const { child, exited, output } = runScript(script);
  await proxy.arrival; // the hub committed the registration and lists the instance
  assert.deepEqual((await hub.instances("node-early-stop")).map((i) => i.status), ["online"]);
  child.kill("SIGTERM");
  await sleep(500); // the signal lands while the answer is held
  proxy.release();
  const { code, signal } = await exited;
  assert.deepEqual({ code, signal }, { code: 0, signal: null }, output());
  assert.match(output(), /closed/);
  assert.ok(proxy.seen.includes("POST /v1/agents/deregister"), JSON.stringify(proxy.seen));
  assert.deepEqual((await hub.instances("node-early-stop")).map((i) => i.status), ["deregistered"]);
});

test("a registration whose answer timed out is deregistered on close", async () => {
  const proxy = await holdingProxy("/v1/agents/register");
  const agent = new Agent({
    agentId: "node-register-timeout",
    addr: `127.0.0.1:${await freePort()}`,
    heartbeatInterval: 60_000,
    hub: proxy.url,
    allowLoopback: true,
    timeoutMs: 500,
  });
  await agent.start(); // the register times out: warned, the heartbeat thread would retry
  try {
    assert.deepEqual((await hub.instances("node-register-timeout")).map((i) => i.status), ["online"]);
  } finally {
    proxy.release();
    await agent.close();
  }
  assert.equal(proxy.seen.filter((s) => s === "POST /v1/agents/deregister").length, 1, JSON.stringify(proxy.seen));
  assert.deepEqual((await hub.instances("node-register-timeout")).map((i) => i.status), ["deregistered"]);
});
