// The wire contract: src/wire.ts and wire-contract.json match a live hub's /openapi.json,
// and what the SDK sends stays within it.

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { createServer } from "node:http";
import { after, before, test } from "node:test";

import { broadcast, send } from "../dist/index.js";
import { CONTRACT_FILE, WIRE_FILE, contractText, renderWire, summarize } from "../scripts/gen-wire.mjs";
import { startHub } from "./harness.mjs";

let hub;
let doc;

before(async () => {
  hub = await startHub({ worker: false, beat: false });
  doc = await (await fetch(hub.url + "/openapi.json")).json();
});

after(async () => {
  await hub?.stop();
});

test("the committed contract is the live hub's (regenerate: node scripts/gen-wire.mjs URL)", () => {
  const live = summarize(doc);
  assert.deepEqual(JSON.parse(readFileSync(CONTRACT_FILE, "utf8")), live);
  assert.equal(readFileSync(CONTRACT_FILE, "utf8"), contractText(live));
});

test("src/wire.ts is generated from it", () => {
  assert.equal(readFileSync(WIRE_FILE, "utf8"), renderWire(summarize(doc)));
});

test("every operation and schema the SDK uses exists in the document", () => {
  const { operations, schemas } = summarize(doc);
  for (const [op, spec] of Object.entries(operations)) assert.notEqual(spec, null, op);
  for (const [name, s] of Object.entries(schemas)) assert.notEqual(s, null, name);
});

test("a drift is caught: a renamed field, a new required one, a changed enum", () => {
  const committed = JSON.parse(readFileSync(CONTRACT_FILE, "utf8"));
  const mutate = (f) => {
    const copy = structuredClone(doc);
    f(copy.components.schemas);
    return summarize(copy);
  };
  assert.notDeepEqual(
    mutate((s) => {
      s.SubmitRequest.properties.deadline_ms = s.SubmitRequest.properties.timeout_ms;
      delete s.SubmitRequest.properties.timeout_ms;
    }),
    committed,
  );
  assert.notDeepEqual(mutate((s) => s.BroadcastRequest.required.push("capability")), committed);
  assert.notDeepEqual(mutate((s) => s.SubmitRequest.properties.priority.enum.push("urgent")), committed);
});

test("what send and broadcast put on the wire is within the contract", async () => {
  const bodies = [];
  const server = createServer((req, res) => {
    let raw = "";
    req.on("data", (c) => (raw += c));
    req.on("end", () => {
      bodies.push({ url: req.url, body: JSON.parse(raw || "{}") });
      res.writeHead(201, { "content-type": "application/json" });
      res.end(JSON.stringify({ task_id: "t-1", status: "pending", broadcast_id: "b-1", complete: true, reason: "all", succeeded: 0, results: [] }));
    });
  });
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  const url = `http://127.0.0.1:${server.address().port}`;
  try {
    await send({
      hub: url,
      method: "m",
      payload: { a: 1 },
      payloadRef: "b-1",
      agentId: "a",
      tags: ["t"],
      capability: "c",
      intent: "i",
      rules: { region: "eu" },
      taskId: "t-1",
      timeoutMs: 1000,
      sessionId: "s",
      priority: "background",
      callbackUrl: "https://example.invalid/cb",
      callbackContext: { x: 1 },
      callbackProgress: true,
      trace: { root_id: "r", parent_task_id: "p", hops: 1, path: ["a"] },
    });
    await broadcast({ hub: url, method: "m", payload: {}, capability: "c", tags: ["t"], rules: {}, minResults: 1, timeoutMs: 1000 });
  } finally {
    server.close();
  }
  const { schemas } = JSON.parse(readFileSync(CONTRACT_FILE, "utf8"));
  const [submit, bcast] = bodies;
  assert.equal(submit.url, "/v1/tasks");
  assert.deepEqual(Object.keys(submit.body).sort(), Object.keys(schemas.SubmitRequest.properties).sort());
  assert.equal(bcast.url, "/v1/broadcasts");
  for (const k of Object.keys(bcast.body)) assert.ok(k in schemas.BroadcastRequest.properties, k);
  for (const k of schemas.BroadcastRequest.required) assert.ok(k in bcast.body, k);
});
