// Unit tests of the heartbeat loop on its own (in-thread), against a local HTTP stand-in
// for the hub that answers when the test says: the loop's stop rules, not the hub's.
import assert from "node:assert/strict";
import { createServer } from "node:http";
import { test } from "node:test";

import { REGISTERED, runHeartbeat } from "../dist/heartbeat.js";

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

test("a heartbeat answered 'unknown instance' after stop does not register again", async () => {
  const seen = [];
  let arrived;
  const beatArrived = new Promise((ok) => (arrived = ok));
  const server = createServer((req, res) => {
    seen.push(req.url);
    req.resume();
    if (req.url === "/v1/agents/heartbeat") {
      arrived();
      // the hub forgot the instance and answers late: after the agent began to close
      setTimeout(() => {
        res.writeHead(404, { "Content-Type": "application/problem+json" });
        res.end(JSON.stringify({ type: "urn:agent-reach:problem:unknown-instance", status: 404 }));
      }, 300);
      return;
    }
    res.writeHead(200, { "Content-Type": "application/json" });
    res.end("{}");
  });
  await new Promise((ok) => server.listen(0, "127.0.0.1", ok));
  const shared = new SharedArrayBuffer(16);
  Atomics.store(new Int32Array(shared), REGISTERED, 1);
  const { port1, port2 } = new MessageChannel();
  const data = {
    hub: `http://127.0.0.1:${server.address().port}`,
    apiKey: "",
    declaration: { agent_id: "late-beat", instance_id: "late-beat-1", max_concurrency: 1 },
    interval: 0.05,
    timeoutMs: 2000,
    shared,
  };
  try {
    const stop = runHeartbeat(data, port1, true);
    await beatArrived;
    stop();
    await sleep(700); // the late answer has come back by now
    assert.equal(seen.filter((u) => u === "/v1/agents/heartbeat").length, 1);
    assert.deepEqual(seen.filter((u) => u === "/v1/agents/register"), []);
  } finally {
    port2.close();
    server.closeAllConnections();
    await new Promise((ok) => server.close(ok));
  }
});
