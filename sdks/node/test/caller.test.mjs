// Integration: a Node caller reaches Python agents through a real hub (reach api + worker
// + beat on SQLite with the embedded broker), and a hub that requires authentication.

import assert from "node:assert/strict";
import { rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";

import {
  BusinessError,
  Forbidden,
  InvalidPayload,
  InvalidTaskRequest,
  NoSuitableAgent,
  ReachError,
  ResultTimeout,
  Backpressure,
  LoopDetected,
  SessionClosed,
  Unauthenticated,
  UnknownSession,
  UnknownTask,
  broadcast,
  closeSession,
  getSession,
  getTask,
  openSession,
  send,
  stream,
  waitForResult,
} from "../dist/index.js";
import { startHub } from "./harness.mjs";

delete process.env.REACH_API_KEY; // each test says which key it sends
delete process.env.REACH_HUB_URL;

let hub;
let authHub;
let keys;

before(async () => {
  [hub, authHub] = await Promise.all([
    startHub(),
    startHub({ extra: { REACH_SECURITY__REQUIRE_AUTH: "true" }, worker: false, beat: false }),
  ]);
  await Promise.all([
    hub.startAgent("py-a", ["solo", "group"]),
    hub.startAgent("py-b", ["group"]),
    hub.startAgent("py-full", []),
  ]);
  keys = { caller: authHub.createKey("caller"), viewer: authHub.createKey("viewer") };
});

after(async () => {
  await Promise.all([hub?.stop(), authHub?.stop()]);
});

describe("a Node caller and Python agents", () => {
  test("send to an agent, then waitForResult returns its answer", async () => {
    const sub = await send({ hub: hub.url, agentId: "py-a", method: "echo", payload: { text: "hi" } });
    assert.match(sub.taskId, /\S/);
    const result = await waitForResult(sub.taskId, { hub: hub.url, timeoutMs: 30_000 });
    assert.deepEqual(result.data, { echo: { text: "hi" }, by: "py-a" });
    assert.equal(result.agentId, "py-a");
    assert.equal(result.task.status, "success");
  });

  test("routing by tags and capability, idempotent on taskId", async () => {
    const taskId = `node-${Date.now()}`;
    const first = await send({ hub: hub.url, tags: ["solo"], capability: "echo", method: "echo", payload: { text: "t" }, taskId });
    const again = await send({ hub: hub.url, tags: ["solo"], capability: "echo", method: "echo", payload: { text: "t" }, taskId });
    assert.equal(first.taskId, taskId);
    assert.equal(again.taskId, taskId);
    const result = await waitForResult(taskId, { hub: hub.url, timeoutMs: 30_000 });
    assert.equal(result.agentId, "py-a"); // the only one tagged "solo"
    const view = await getTask(taskId, { hub: hub.url });
    assert.equal(view.status, "success");
  });

  test("broadcast reaches both Python agents", async () => {
    const b = await broadcast({ hub: hub.url, capability: "echo", tags: ["group"], method: "echo", payload: { text: "all" }, timeoutMs: 30_000 });
    assert.equal(b.complete, true);
    assert.equal(b.succeeded, 2);
    assert.deepEqual(b.data.map((d) => d.by).sort(), ["py-a", "py-b"]);
    assert.ok(b.results.every((r) => r.status === "success"));
  });

  test("stream yields the state, progress and the result in order, then ends", async () => {
    const sub = await send({ hub: hub.url, agentId: "py-b", method: "work.do", payload: { steps: 3 } });
    const events = [];
    for await (const e of stream(sub.taskId, { hub: hub.url, timeoutMs: 30_000 })) events.push(e);
    assert.equal(events[0].kind, "state");
    assert.equal(events.at(-1).kind, "result");
    assert.deepEqual(events.at(-1).data.result, { steps: 3, by: "py-b" });
    const progress = events.filter((e) => e.kind === "progress").map((e) => e.data.progress);
    assert.deepEqual(progress, [1 / 3, 2 / 3, 1]);
    const ids = events.map((e) => e.id);
    assert.deepEqual(ids, [...ids].sort((a, b) => a - b));
    assert.equal(new Set(ids).size, ids.length);
  });

  test("a stream resumed with Last-Event-ID goes on after that event, nothing twice", async () => {
    const gate = join(hub.home, `gate-${Date.now()}`);
    const sub = await send({ hub: hub.url, agentId: "py-a", method: "work.do", payload: { steps: 3, gate } });
    const before = [];
    for await (const e of stream(sub.taskId, { hub: hub.url, timeoutMs: 30_000 })) {
      before.push(e);
      if (e.kind === "progress") break; // drop the connection mid-way (the agent waits at the gate)
    }
    const lastId = before.at(-1).id;
    assert.equal(before.at(-1).data.progress, 1 / 3);
    writeFileSync(gate, "go");
    const rest = [];
    try {
      for await (const e of stream(sub.taskId, { hub: hub.url, timeoutMs: 30_000, lastEventId: lastId })) rest.push(e);
    } finally {
      rmSync(gate, { force: true });
    }
    assert.ok(rest.every((e) => e.id > lastId), JSON.stringify(rest.map((e) => e.id)));
    assert.deepEqual(rest.filter((e) => e.kind === "progress").map((e) => e.data.progress), [2 / 3, 1]);
    assert.equal(rest.at(-1).kind, "result");
  });
});

describe("typed errors from a real hub", () => {
  test("an unknown agent is NoSuitableAgent", async () => {
    await assert.rejects(send({ hub: hub.url, agentId: "nobody-here", method: "echo", payload: { text: "x" } }), (e) => {
      assert.ok(e instanceof NoSuitableAgent, e);
      assert.equal(e.status, 404);
      assert.equal(e.type, "urn:agent-reach:problem:no-suitable-agent");
      return true;
    });
  });

  test("a payload against the capability's schema is InvalidPayload; a malformed body InvalidTaskRequest", async () => {
    await assert.rejects(send({ hub: hub.url, agentId: "py-a", method: "echo", payload: { nope: 1 } }), InvalidPayload);
    await assert.rejects(send({ hub: hub.url, agentId: "py-a", method: "has spaces", payload: {} }), InvalidTaskRequest);
    await assert.rejects(send({ hub: hub.url, agentId: "py-a", method: "echo", payload: { text: "x" }, timeoutMs: -5 }), InvalidTaskRequest);
  });

  test("an agent's business error comes back from waitForResult as BusinessError", async () => {
    const sub = await send({ hub: hub.url, agentId: "py-b", method: "fail", payload: {} });
    await assert.rejects(waitForResult(sub.taskId, { hub: hub.url, timeoutMs: 30_000 }), (e) => {
      assert.ok(e instanceof BusinessError, e);
      assert.equal(e.code, 7);
      assert.equal(e.message, "asked to fail");
      return true;
    });
  });

  test("an unknown task is UnknownTask (get, wait and stream); a wait too short ResultTimeout", async () => {
    await assert.rejects(getTask("t-does-not-exist", { hub: hub.url }), UnknownTask);
    await assert.rejects(waitForResult("t-does-not-exist", { hub: hub.url }), UnknownTask);
    await assert.rejects(async () => {
      for await (const _ of stream("t-does-not-exist", { hub: hub.url })) break;
    }, UnknownTask);
    const gate = join(hub.home, `never-${Date.now()}`);
    const sub = await send({ hub: hub.url, agentId: "py-b", method: "work.do", payload: { steps: 2, gate } });
    await assert.rejects(waitForResult(sub.taskId, { hub: hub.url, timeoutMs: 300 }), (e) => {
      assert.ok(e instanceof ResultTimeout, e);
      assert.equal(e.extra.task_id, sub.taskId);
      return true;
    });
    writeFileSync(gate, "go"); // let it finish
  });
});

describe("flow control, loops and sessions", () => {
  test("a full agent answers Backpressure with retryAfterMs, depth and limit", async () => {
    const set = await fetch(`${hub.url}/api/v1/agents/py-full/max-queue`, {
      method: "PUT",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ max_queue: 1 }),
    });
    assert.equal(set.status, 200, await set.text());
    const gate = join(hub.home, `full-${Date.now()}`);
    const held = await send({ hub: hub.url, agentId: "py-full", method: "work.do", payload: { steps: 1, gate } });
    try {
      const err = await send({ hub: hub.url, agentId: "py-full", method: "work.do", payload: { steps: 1 } }).catch((e) => e);
      assert.ok(err instanceof Backpressure, err);
      assert.equal(err.status, 429);
      assert.equal(err.limit, 1);
      assert.ok(err.depth >= 1, JSON.stringify(err.extra));
      assert.ok(err.retryAfterMs > 0, String(err.retryAfterMs));
    } finally {
      writeFileSync(gate, "go");
    }
    await waitForResult(held.taskId, { hub: hub.url, timeoutMs: 30_000 });
  });

  test("a reach that repeats an agent of its path is LoopDetected", async () => {
    const trace = { root_id: "r-loop", parent_task_id: "t-parent", hops: 1, path: ["py-a"] };
    const err = await send({ hub: hub.url, agentId: "py-a", method: "echo", payload: { text: "x" }, trace }).catch((e) => e);
    assert.ok(err instanceof LoopDetected, err);
    assert.equal(err.status, 508);
  });

  test("a closed session refuses new reaches: SessionClosed", async () => {
    const id = `s-node-${Date.now()}`;
    await assert.rejects(getSession(id, { hub: hub.url }), UnknownSession);
    assert.equal((await openSession(id, { hub: hub.url, ttlS: 60 })).state, "open");
    assert.equal((await getSession(id, { hub: hub.url })).alive, true);
    const closed = await closeSession(id, { hub: hub.url, reason: "user left" });
    assert.equal(closed.state, "closed");
    const err = await send({ hub: hub.url, agentId: "py-a", method: "echo", payload: { text: "x" }, sessionId: id }).catch((e) => e);
    assert.ok(err instanceof SessionClosed, err);
    await assert.rejects(openSession(id, { hub: hub.url }), SessionClosed);
  });
});

describe("a hub that requires authentication", () => {
  test("without a key: Unauthenticated", async () => {
    await assert.rejects(send({ hub: authHub.url, apiKey: "", agentId: "x", method: "echo" }), (e) => {
      assert.ok(e instanceof Unauthenticated, e);
      assert.equal(e.status, 401);
      return true;
    });
  });

  test("a wrong key: Unauthenticated, and the key is in no error", async () => {
    const wrong = keys.caller.slice(0, -6) + "XXXXXX";
    const err = await send({ hub: authHub.url, apiKey: wrong, agentId: "x", method: "echo" }).catch((e) => e);
    assert.ok(err instanceof Unauthenticated, err);
    assert.ok(!JSON.stringify([err.message, err.extra, String(err), err.stack]).includes(wrong));
  });

  test("a viewer key may not send: Forbidden", async () => {
    const err = await send({ hub: authHub.url, apiKey: keys.viewer, agentId: "x", method: "echo" }).catch((e) => e);
    assert.ok(err instanceof Forbidden, err);
    assert.ok(!JSON.stringify([err.message, err.extra, String(err), err.stack]).includes(keys.viewer));
  });

  test("a caller key from $REACH_API_KEY is accepted (routing then finds nobody)", async () => {
    process.env.REACH_API_KEY = keys.caller;
    try {
      const err = await send({ hub: authHub.url, agentId: "x", method: "echo" }).catch((e) => e);
      assert.ok(err instanceof NoSuitableAgent, err);
      assert.ok(err instanceof ReachError);
      assert.ok(!JSON.stringify([err.message, err.extra, String(err)]).includes(keys.caller));
    } finally {
      delete process.env.REACH_API_KEY;
    }
  });
});
