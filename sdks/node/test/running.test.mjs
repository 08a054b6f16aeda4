// Long handlers without a hub: the 202 after acceptAfterMs, keepalives at a third of the
// delivery's budget, the report of each outcome (to a recording stand-in hub: a real
// node:http server on 127.0.0.1), values that are not JSON, copies while running.
import assert from "node:assert/strict";
import { createServer } from "node:http";
import { after, before, test } from "node:test";

import { Agent } from "../dist/agent.js";
import { BusinessError } from "../dist/errors.js";
import { acceptWaitMs, keepaliveIntervalMs, notJson } from "../dist/running.js";

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** What the agent POSTs to its hub, with when; `refuse` queues other answers for a path. */
let hub;
before(async () => {
  const posts = [];
  const refusals = new Map();
  const server = createServer(async (req, res) => {
    const chunks = [];
    for await (const c of req) chunks.push(c);
    posts.push({ path: req.url, body: JSON.parse(Buffer.concat(chunks).toString() || "{}"), at: Date.now() });
    const [status, body] = refusals.get(req.url)?.shift() ?? [200, req.url.endsWith("/result") ? { decided: true } : {}];
    const data = JSON.stringify(body);
    res.writeHead(status, { "Content-Type": status >= 400 ? "application/problem+json" : "application/json" });
    res.end(data);
  });
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  hub = {
    url: `http://127.0.0.1:${server.address().port}`,
    posts,
    refuse: (path, ...answers) => refusals.set(path, answers),
    to: (path) => posts.filter((p) => p.path === path),
    close: () => new Promise((r) => (server.closeAllConnections(), server.close(() => r()))),
  };
});
after(async () => hub?.close());

function agentWith(opts = {}) {
  return new Agent({
    agentId: "node-thinker",
    addr: "127.0.0.1:9",
    allowLoopback: true,
    hub: hub.url,
    verifyTokens: false,
    ...opts,
  });
}

async function resultOf(taskId, count = 1, timeoutMs = 10_000) {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    const found = hub.to(`/v1/tasks/${taskId}/result`);
    if (found.length >= count) return found;
    await sleep(20);
  }
  throw new Error(`no result report of ${taskId}: ${JSON.stringify(hub.posts)}`);
}

test("how long a delivery waits, and how often a run answered 202 keeps alive", () => {
  const now = 1_000_000_000;
  assert.equal(acceptWaitMs(10_000, undefined, now), 10_000);
  assert.equal(acceptWaitMs(10_000, now + 30_000, now), 10_000);
  assert.equal(acceptWaitMs(10_000, now + 12_000, now), 6_000);
  assert.equal(acceptWaitMs(10_000, now - 1_000, now), 0);
  assert.equal(acceptWaitMs(null, now + 30_000, now), null);
  for (const [budget, every] of [
    [30_000, 10_000],
    [90_000, 10_000],
    [12_000, 4_000],
    [3_000, 1_000],
    [-5, 1_000],
  ]) {
    assert.equal(keepaliveIntervalMs(budget), every, `budget ${budget}`);
  }
});

test("what is not JSON, and where", () => {
  const cycle = { a: 1 };
  cycle.self = cycle;
  const cases = [
    [{ ok: [1, "two", null, true, { d: new Date(0) }] }, null],
    [undefined, null],
    [Number.NaN, { what: "a non-finite number (NaN)", at: "" }],
    [{ n: [1, Infinity] }, { what: "a non-finite number (Infinity)", at: ".n[1]" }],
    [10n, { what: "a bigint", at: "" }],
    [new Map(), { what: "a Map", at: "" }],
    [{ s: new Set([1]) }, { what: "a Set", at: ".s" }],
    [{ later: Promise.resolve(1) }, { what: "a promise (did you mean await?)", at: ".later" }],
    [() => 1, { what: "a function", at: "" }],
    [cycle, { what: "a cycle", at: ".self" }],
  ];
  for (const [value, expected] of cases) assert.deepEqual(notJson(value), expected);
});

test("a value that is not JSON is a 500 naming the method, never a 200", async () => {
  const agent = agentWith();
  let runs = 0;
  agent.route("m", async () => {
    runs += 1;
    return { rows: new Map() };
  });
  const [status, body] = await agent.invoke("m", { task_id: "t-nj", payload: {}, attempt_seq: 1 });
  assert.equal(status, 500);
  assert.deepEqual(body, { code: -1, message: "handler for 'm' returned a value holding a Map at .rows, which is not JSON" });
  await agent.invoke("m", { task_id: "t-nj", payload: {}, attempt_seq: 2 });
  assert.equal(runs, 2); // not remembered: the retry runs again
});

test("a long handler is answered 202, kept alive, and its value reported", async () => {
  const agent = agentWith({ acceptAfterMs: 300 });
  let runs = 0;
  agent.route("think", async (taskId, payload) => {
    runs += 1;
    await sleep(3_500);
    return { thought: payload.q };
  });
  const sent = Date.now();
  const body = { task_id: "t-long", payload: { q: "why" }, attempt_seq: 1, deadline: sent / 1000 + 3 };
  const answer = await agent.invoke("think", body);
  assert.deepEqual(answer, [202, { code: 0, accepted: true }]);
  assert.ok(Date.now() - sent < 1_000);
  const [report] = await resultOf("t-long");
  assert.deepEqual(report.body, {
    code: 0,
    data: { thought: "why" },
    message: "",
    attempt_seq: 1,
    instance_id: agent.instanceId,
  });
  const keepalives = hub.to("/v1/tasks/t-long/progress");
  assert.ok(keepalives.length >= 2 && keepalives.length <= 4, JSON.stringify(keepalives));
  for (const k of keepalives) assert.deepEqual(k.body, { attempt_seq: 1, instance_id: agent.instanceId, keepalive: true });
  for (let i = 1; i < keepalives.length; i++) {
    const gap = keepalives[i].at - keepalives[i - 1].at;
    assert.ok(gap >= 700 && gap <= 1_400, `keepalives ${gap} ms apart`);
  }
  assert.deepEqual(await agent.invoke("think", { ...body, attempt_seq: 2 }), [200, { code: 0, data: { thought: "why" } }]);
  assert.equal(runs, 1);
  assert.equal(agent.inFlight, 0);
});

test("after the 202: a business error is reported as such, a failure as transient", async () => {
  const agent = agentWith({ acceptAfterMs: 100 });
  let runs = 0;
  agent.route("refuse", async () => {
    await sleep(300);
    throw new BusinessError(7, "no");
  });
  agent.route("fail", async () => {
    runs += 1;
    await sleep(300);
    throw new TypeError("model endpoint reset");
  });
  assert.equal((await agent.invoke("refuse", { task_id: "t-b", payload: {}, attempt_seq: 1 }))[0], 202);
  assert.equal((await agent.invoke("fail", { task_id: "t-f", payload: {}, attempt_seq: 1 }))[0], 202);
  const [business] = await resultOf("t-b");
  const [transient] = await resultOf("t-f");
  assert.deepEqual(business.body, { code: 7, data: null, message: "no", attempt_seq: 1, instance_id: agent.instanceId });
  assert.deepEqual(transient.body, {
    code: -1,
    data: null,
    message: "TypeError: model endpoint reset",
    transient: true,
    attempt_seq: 1,
    instance_id: agent.instanceId,
  });
  assert.equal((await agent.invoke("fail", { task_id: "t-f", payload: {}, attempt_seq: 2 }))[0], 202);
  assert.equal(runs, 2); // the failure was not remembered: the hub's retry ran it again
});

test("a copy after the 202 is answered 202 and the report names its attempt", async () => {
  const agent = agentWith({ acceptAfterMs: 200 });
  let runs = 0;
  agent.route("think", async () => {
    runs += 1;
    await sleep(1_200);
    return "done";
  });
  assert.equal((await agent.invoke("think", { task_id: "t-copy", payload: {}, attempt_seq: 1 }))[0], 202);
  const copy = await agent.invoke("think", { task_id: "t-copy", payload: {}, attempt_seq: 2 });
  assert.deepEqual(copy, [202, { code: 0, accepted: true, message: "already running" }]);
  const [report] = await resultOf("t-copy");
  assert.equal(report.body.attempt_seq, 2);
  assert.equal(runs, 1);
});

test("a report waits out a hub outage; a stale one is not retried", async () => {
  const down = [503, { type: "about:blank", title: "Service Unavailable", status: 503 }];
  const stale = [409, { type: "urn:agent-reach:problem:stale-report", title: "Stale", status: 409, detail: "moved on" }];
  hub.refuse("/v1/tasks/t-out/result", down, down);
  hub.refuse("/v1/tasks/t-old/result", stale);
  const agent = agentWith({ acceptAfterMs: 50 });
  agent.route("think", async () => {
    await sleep(200);
    return "kept";
  });
  assert.equal((await agent.invoke("think", { task_id: "t-out", payload: {}, attempt_seq: 1 }))[0], 202);
  assert.equal((await agent.invoke("think", { task_id: "t-old", payload: {}, attempt_seq: 1 }))[0], 202);
  const reports = await resultOf("t-out", 3);
  assert.ok(reports[2].at - reports[0].at >= 1_200, "backoff 0.5 s, then 1 s");
  await sleep(1_000);
  assert.equal(hub.to("/v1/tasks/t-old/result").length, 1);
});

test("acceptAfterMs null answers when the handler ends", async () => {
  const agent = agentWith({ acceptAfterMs: null });
  agent.route("think", async () => {
    await sleep(600);
    return "patient";
  });
  const answer = await agent.invoke("think", { task_id: "t-sync", payload: {}, attempt_seq: 1, deadline: Date.now() / 1000 + 0.5 });
  assert.deepEqual(answer, [200, { code: 0, data: "patient" }]);
});
