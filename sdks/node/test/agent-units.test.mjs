// Unit tests of the agent's token check and dedup guard (no hub: keys are our own).
import assert from "node:assert/strict";
import { generateKeyPairSync, randomUUID, sign } from "node:crypto";
import { test } from "node:test";

import { Agent, wrap } from "../dist/agent.js";
import { IdempotencyGuard } from "../dist/dedup.js";
import { InvalidRegistration } from "../dist/errors.js";
import { TokenVerifier, bearerOf, bodyDigest, checkClaims } from "../dist/tokens.js";

const b64 = (obj) => Buffer.from(JSON.stringify(obj)).toString("base64url");

export function keyPair(kid = "k1") {
  const { publicKey, privateKey } = generateKeyPairSync("ed25519");
  const jwk = { ...publicKey.export({ format: "jwk" }), kid, alg: "EdDSA", use: "sig" };
  return { kid, jwk, privateKey };
}

export function mint(pair, claims, header = {}) {
  const h = b64({ alg: "EdDSA", typ: "JWT", kid: pair.kid, ...header });
  const p = b64(claims);
  const s = sign(null, Buffer.from(`${h}.${p}`), pair.privateKey).toString("base64url");
  return `${h}.${p}.${s}`;
}

const NOW = 1_800_000_000;
const BODY = { task_id: "t-1", attempt_seq: 1, payload: {} };
const RAW = Buffer.from(JSON.stringify(BODY));
const claimsFor = (over = {}) => ({
  iss: "reach-hub",
  sub: "task",
  aud: "agent-a",
  task_id: "t-1",
  attempt_seq: 1,
  method: "echo",
  body_sha256: bodyDigest(RAW),
  iat: NOW - 1,
  exp: NOW + 60,
  jti: randomUUID(),
  ...over,
});

function verifier(keys, opts = {}) {
  let fetches = 0;
  const v = new TokenVerifier("http://hub.invalid", "agent-a", {
    clock: () => (opts.now ?? NOW) * 1000,
    fetchKeys: async () => {
      fetches += 1;
      if (opts.down) throw new Error("connection refused");
      return { keys: keys.map((k) => k.jwk) };
    },
    ...opts.extra,
  });
  return { v, fetches: () => fetches };
}

test("a good token passes once; its replay is refused", async () => {
  const pair = keyPair();
  const { v } = verifier([pair]);
  const token = mint(pair, claimsFor());
  assert.equal(await v.check(`Bearer ${token}`, BODY, "echo", RAW), null);
  const again = await v.check(`Bearer ${token}`, BODY, "echo", RAW);
  assert.equal(again?.status, 401);
  assert.match(again.message, /replayed jti/);
});

test("forged, misaddressed, expired and mismatched tokens are refused with 401", async () => {
  const hub = keyPair("hub-key");
  const forger = keyPair("hub-key"); // same kid, a key the hub never published
  const { v } = verifier([hub]);
  const cases = [
    [null, /no reach token/],
    ["Basic abc", /no reach token/],
    ["Bearer not-a-jwt", /malformed/],
    [`Bearer ${mint(forger, claimsFor())}`, /signature does not verify/],
    [`Bearer ${mint(hub, claimsFor(), { alg: "none" })}`, /not signed with EdDSA/],
    [`Bearer ${mint(hub, claimsFor(), { alg: "HS256" })}`, /not signed with EdDSA/],
    [`Bearer ${mint(hub, claimsFor(), { kid: "" })}`, /names no signing key/],
    [`Bearer ${mint(hub, claimsFor({ aud: "agent-b" }))}`, /meant for another agent/],
    [`Bearer ${mint(hub, claimsFor({ aud: ["agent-a"] }))}`, /meant for another agent/],
    [`Bearer ${mint(hub, claimsFor({ iat: NOW - 200, exp: NOW - 100 }))}`, /expired/],
    [`Bearer ${mint(hub, claimsFor({ iat: NOW + 100, exp: NOW + 200 }))}`, /in the future/],
    [`Bearer ${mint(hub, claimsFor({ exp: NOW + 5000 }))}`, /lifetime exceeds/],
    [`Bearer ${mint(hub, claimsFor({ task_id: "t-2" }))}`, /another task/],
    [`Bearer ${mint(hub, claimsFor({ attempt_seq: 2 }))}`, /another attempt/],
    [`Bearer ${mint(hub, claimsFor({ jti: undefined }))}`, /lacks claims: jti/],
  ];
  for (const [authorization, reason] of cases) {
    const refusal = await v.check(authorization, BODY, "echo", RAW);
    assert.equal(refusal?.status, 401, `${authorization}: ${refusal?.message}`);
    assert.match(refusal.message, reason);
  }
  // a captured token bound to this request, replayed with another payload or method
  const bound = `Bearer ${mint(hub, claimsFor())}`;
  const other = { ...BODY, payload: { amount: 1_000_000 } };
  const otherRaw = Buffer.from(JSON.stringify(other));
  assert.match((await v.check(bound, other, "echo", otherRaw)).message, /signed for another body/);
  assert.match((await v.check(bound, BODY, "pay", RAW)).message, /another method/);
  const noSeq = { task_id: "t-1", payload: {} };
  const noSeqRaw = Buffer.from(JSON.stringify(noSeq));
  const unbound = `Bearer ${mint(hub, claimsFor({ body_sha256: bodyDigest(noSeqRaw) }))}`;
  assert.match((await v.check(unbound, noSeq, "echo", noSeqRaw)).message, /names no attempt_seq/);
  assert.match((await v.check(`Bearer ${mint(hub, claimsFor({ method: undefined }))}`, BODY, "echo", RAW)).message, /lacks claims: method/);
  assert.equal(await v.check(bound, BODY, "echo", RAW), null); // not spent by the refusals
  // a tampered payload under the hub's own signature
  const [h, , s] = mint(hub, claimsFor()).split(".");
  const tampered = `${h}.${b64(claimsFor({ aud: "agent-a", task_id: "t-1" }))}.${s}`;
  assert.match((await v.check(`Bearer ${tampered}`, BODY, "echo", RAW)).message, /signature does not verify/);
});

test("an unknown kid refetches the keys, rate-limited; a rotated key is then accepted", async () => {
  let mono = 100;
  const old = keyPair("old");
  const keys = [old];
  const { v, fetches } = verifier(keys, { extra: { timer: () => mono * 1000 } });
  assert.equal(await v.check(`Bearer ${mint(old, claimsFor())}`, BODY, "echo", RAW), null);
  assert.equal(fetches(), 1);
  const stranger = keyPair("stranger");
  const soon = await v.check(`Bearer ${mint(stranger, claimsFor())}`, BODY, "echo", RAW);
  assert.equal(soon.status, 503); // fetched moments ago: no new fetch, the hub retries
  assert.equal(fetches(), 1);
  mono += 6; // past refetchInterval (5 s)
  const later = await v.check(`Bearer ${mint(stranger, claimsFor())}`, BODY, "echo", RAW);
  assert.equal(later.status, 401);
  assert.match(later.message, /does not publish/);
  assert.equal(fetches(), 2);
  for (let i = 0; i < 20; i++) await v.check(`Bearer ${mint(keyPair(`forged-${i}`), claimsFor())}`, BODY, "echo", RAW);
  assert.equal(fetches(), 2); // forged kids cannot make the agent hammer its hub
  const fresh = keyPair("new"); // the hub rotates
  keys.push(fresh);
  mono += 6;
  assert.equal(await v.check(`Bearer ${mint(fresh, claimsFor())}`, BODY, "echo", RAW), null);
  assert.equal(await v.check(`Bearer ${mint(old, claimsFor())}`, BODY, "echo", RAW), null);
  assert.equal(fetches(), 3);
});

test("keys out of reach: 503, so the hub retries", async () => {
  const pair = keyPair();
  const { v } = verifier([pair], { down: true });
  const refusal = await v.check(`Bearer ${mint(pair, claimsFor())}`, BODY, "echo", RAW);
  assert.equal(refusal.status, 503);
});

test("bearerOf and checkClaims mirror the Python rules", () => {
  assert.equal(bearerOf("bearer  abc "), "abc");
  assert.equal(bearerOf("Bearer"), null);
  const got = { taskId: "t-1", attemptSeq: 1, method: "echo", bodySha256: bodyDigest(RAW) };
  assert.equal(checkClaims(claimsFor(), "agent-a", got, NOW), null);
  assert.match(checkClaims(claimsFor({ attempt_seq: 1.5 }), "agent-a", got, NOW), /attempt_seq/);
  assert.match(checkClaims(claimsFor({ iss: "x" }), "agent-a", got, NOW, 30, "reach-hub"), /another issuer/);
  assert.match(checkClaims(claimsFor(), "agent-a", { ...got, attemptSeq: undefined }, NOW), /names no attempt_seq/);
  assert.match(checkClaims(claimsFor(), "agent-a", { ...got, bodySha256: bodyDigest("{}") }, NOW), /another body/);
  // the digest is the Python hub's: hex sha256 of the bytes
  assert.equal(bodyDigest("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
});

test("dedup: a finished answer is returned, a failure is not remembered", () => {
  const g = new IdempotencyGuard();
  assert.equal(g.begin("a").action, "run");
  const running = g.begin("a");
  assert.equal(running.action, "running");
  g.finish("a", [200, { code: 0, data: 1 }], true);
  const done = g.begin("a");
  assert.equal(done.action, "done");
  assert.deepEqual(done.answer, [200, { code: 0, data: 1 }]);
  assert.equal(g.begin("b").action, "run");
  g.finish("b", [500, { code: -1 }], false);
  assert.equal(g.begin("b").action, "run");
});

test("dedup: bounded by count, bytes and age, least recently used first", async () => {
  let now = 0;
  const g = new IdempotencyGuard({ capacity: 2, maxBytes: 10_000, ttlMs: 10, timer: () => now });
  for (const id of ["a", "b"]) {
    g.begin(id);
    g.finish(id, [200, { code: 0, data: id }], true);
  }
  g.answerOf("a"); // a is now more recent than b
  g.begin("c");
  g.finish("c", [200, { code: 0, data: "c" }], true);
  assert.equal(g.size, 2);
  assert.equal(g.answerOf("b"), undefined);
  assert.ok(g.answerOf("a"));
  now = 11;
  assert.equal(g.answerOf("a"), undefined);
  assert.equal(g.size, 0);
  const small = new IdempotencyGuard({ maxBytes: 60 });
  for (const id of ["x", "y", "z"]) {
    small.begin(id);
    small.finish(id, [200, { code: 0, data: "0123456789" }], true);
  }
  assert.ok(small.bytesHeld <= 60);
  assert.equal(small.answerOf("x"), undefined);
  assert.ok(small.answerOf("z"));
  const huge = new IdempotencyGuard({ maxBytes: 10 });
  huge.begin("big");
  huge.finish("big", [200, { code: 0, data: "far more than ten bytes" }], true);
  assert.equal(huge.size, 0);
});

test("agent options: intervals in ms, the registration body in the hub's units", () => {
  assert.throws(() => new Agent({ agentId: "a", addr: "127.0.0.1:1", heartbeatInterval: 10 }), InvalidRegistration);
  assert.throws(() => new Agent({ agentId: "a", channel: false }), InvalidRegistration);
  const agent = new Agent({ agentId: "a", addr: "http://10.0.0.5:7001/reach", tags: ["z", "b"], heartbeatInterval: 2500, maxConcurrency: 3 });
  assert.equal(agent.declaration.heartbeat_interval, 2.5);
  assert.deepEqual(agent.declaration.tags, ["b", "z"]);
  assert.equal(agent.declaration.max_concurrency, 3);
  assert.equal(agent.channel, false);
  const channel = new Agent({ agentId: "c" });
  assert.equal(channel.channel, true);
  assert.equal(channel.declaration.allow_loopback, true);
  assert.deepEqual(wrap({ code: 3, message: "m" }), { code: 3, message: "m" });
  assert.deepEqual(wrap({ code: true }), { code: 0, data: { code: true } });
  assert.deepEqual(wrap(undefined), { code: 0, data: null });
});

test("agent.fetch (Hono-style) and agent.handler() with a pre-parsed body serve the same routes", async () => {
  const open = new Agent({ agentId: "f", addr: "http://127.0.0.1:1/reach", verifyTokens: false });
  let runs = 0;
  open.route("echo", (taskId, payload) => (runs += 1, { payload }));
  const health = await open.fetch(new Request("http://x/reach/healthz"));
  assert.equal((await health.json()).agent_id, "f");
  const ok = await open.fetch(new Request("http://x/reach/tasks/echo", { method: "POST", body: JSON.stringify({ task_id: "t", payload: { a: 1 } }) }));
  assert.deepEqual([ok.status, await ok.json()], [200, { code: 0, data: { payload: { a: 1 } } }]);
  assert.equal((await open.fetch(new Request("http://x/reach/%E0%A4%A"))).status, 400);
  assert.equal((await open.fetch(new Request("http://x/reach/tasks/none", { method: "POST", body: "{}" }))).status, 404);
  // Express after express.json(): req.body is the object, the stream already drained
  const { Readable } = await import("node:stream");
  const req = Object.assign(Readable.from([]), {
    url: "/tasks/echo", method: "POST", headers: { "content-length": "30" }, body: { task_id: "t2", payload: { b: 2 } },
  });
  const res = await new Promise((resolve) => {
    const out = { status: 0, text: "", headersSent: false,
      writeHead(s) { this.status = s; this.headersSent = true; return this; },
      end(d) { this.text = String(d); resolve(this); } };
    open.handler()(req, out, () => resolve({ status: "next" }));
  });
  assert.deepEqual([res.status, JSON.parse(res.text)], [200, { code: 0, data: { payload: { b: 2 } } }]);
  assert.equal(runs, 2);
  // with tokens on, no token: 401 and the handler does not run
  const guarded = new Agent({ agentId: "g", addr: "127.0.0.1:1", hub: "http://127.0.0.1:9" });
  let ran = false;
  guarded.route("echo", () => (ran = true));
  const refused = await guarded.fetch(new Request("http://x/tasks/echo", { method: "POST", body: JSON.stringify({ task_id: "t", payload: {} }) }));
  assert.equal(refused.status, 401);
  assert.equal(ran, false);
});

test("a route whose method is a path is refused: the hub would never deliver to it (issue 37)", () => {
  const agent = new Agent({ agentId: "a", addr: "http://10.0.0.5:7001" });
  for (const method of ["x/../../p", "../admin", "a/./b", "a//b"]) {
    assert.throws(() => agent.route(method, () => ({})), /not a name/);
  }
  agent.route("doc/summarise:v2", () => ({})); // a name with parts is fine
});

test("a delivery's traceparent reaches the handler, and send() carries it to the hub as the header", async () => {
  const { createServer } = await import("node:http");
  const { send } = await import("../dist/index.js");
  const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
  const seen = [];
  const hubSide = createServer((req, res) => {
    seen.push(req.headers["traceparent"] ?? null);
    res.writeHead(201, { "content-type": "application/json" });
    res.end(JSON.stringify({ task_id: "inner", status: "pending" }));
  });
  await new Promise((r) => hubSide.listen(0, "127.0.0.1", r));
  const hub = `http://127.0.0.1:${hubSide.address().port}`;
  try {
    const open = new Agent({ agentId: "tp", addr: "http://127.0.0.1:1", verifyTokens: false });
    open.route("echo", async (taskId, payload, delivery) => {
      await send({ agentId: "b", method: "echo", hub, trace: delivery.childTrace, traceparent: delivery.traceparent });
      return { traceparent: delivery.traceparent ?? null };
    });
    const deliver = (trace) => open.fetch(new Request("http://x/tasks/echo", {
      method: "POST", body: JSON.stringify({ task_id: `t${seen.length}`, payload: {}, trace }),
    }));
    const traced = await (await deliver({ root_id: "r", hops: 0, path: [], traceparent: tp })).json();
    assert.equal(traced.data.traceparent, tp);
    const junk = await (await deliver({ root_id: "r", hops: 0, path: [], traceparent: "junk" })).json();
    assert.equal(junk.data.traceparent, null);
    assert.deepEqual(seen, [tp, null]);
  } finally {
    hubSide.closeAllConnections();
    hubSide.close();
  }
});
