// Unit tests without a hub: problem -> typed error, the SSE parser, the HTTP client's
// edge (against a real local HTTP server of this process, not a mock).

import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { createServer } from "node:http";
import { after, before, describe, test } from "node:test";

import {
  ApprovalRejected,
  Backpressure,
  BusinessError,
  CircuitOpen,
  ConfigError,
  DeadLettered,
  ERROR_BY_TYPE,
  ERROR_CLASSES,
  Forbidden,
  HubClient,
  HubOverloaded,
  HubUnavailable,
  InvalidPayload,
  InvalidTaskRequest,
  LoopDetected,
  NoSuitableAgent,
  ProtocolError,
  ReachError,
  ResultTimeout,
  RoutingError,
  SessionClosed,
  SseParser,
  StreamEvent,
  TaskConflict,
  IllegalTransition,
  broadcast,
  send,
  Unauthenticated,
  errorForProblem,
  outcome,
  parseSse,
  redact,
  streamPath,
  resolveApiKey,
} from "../dist/index.js";
import { python, REPO } from "./harness.mjs";

const P = "urn:agent-reach:problem:";
// the defaults under test come from these: start without them whatever the shell set
delete process.env.REACH_API_KEY;
delete process.env.REACH_HUB_URL;

describe("errors", () => {
  test("every class of reach/errors.py has its twin, with the same slug, status and parent", () => {
    // the Python tree, read from the real module: name -> [slug, status, parent name]
    const code = [
      "import json, reach.errors as e",
      "out = {}",
      "for c in [e.ReachError, *e._all_subclasses(e.ReachError)]:",
      "    out[c.__name__] = [c.slug, c.status, c.__mro__[1].__name__]",
      "print(json.dumps(out))",
    ].join("\n");
    const r = spawnSync(python(), ["-c", code], { cwd: REPO, encoding: "utf8" });
    assert.equal(r.status, 0, r.stderr);
    const tree = JSON.parse(r.stdout);
    const ours = Object.fromEntries(
      ERROR_CLASSES.map((c) => [c.name, [c.slug, c.defaultStatus, Object.getPrototypeOf(c).name]]),
    );
    ours.ReachError[2] = "Exception";
    assert.deepEqual(ours, tree);
  });

  test("a problem becomes the class of its type, detail and extra kept", () => {
    const err = errorForProblem(
      { type: P + "no-suitable-agent", title: "No suitable agent", status: 404, detail: "nobody", agent_id: "x" },
      404,
    );
    assert.ok(err instanceof NoSuitableAgent && err instanceof RoutingError && err instanceof ReachError);
    assert.equal(err.name, "NoSuitableAgent");
    assert.equal(err.message, "nobody");
    assert.equal(err.detail, "nobody");
    assert.equal(err.status, 404);
    assert.equal(err.type, P + "no-suitable-agent");
    assert.deepEqual(err.extra, { agent_id: "x" });
  });

  test("every mapped type comes back as its own class", () => {
    for (const [type, cls] of ERROR_BY_TYPE) {
      const err = errorForProblem({ type, detail: "d" }, cls.defaultStatus);
      assert.equal(err.constructor, cls, type);
    }
    assert.ok(errorForProblem({ type: P + "illegal-transition" }, 409) instanceof TaskConflict);
    assert.ok(errorForProblem({ type: P + "illegal-transition" }, 409) instanceof IllegalTransition);
  });

  test("Backpressure carries retryAfterMs, depth and limit; Retry-After is the fallback", () => {
    const bp = errorForProblem({ type: P + "backpressure", detail: "full", depth: 10, limit: 10, retry_after_ms: 1500 }, 429, 2000);
    assert.ok(bp instanceof Backpressure);
    assert.equal(bp.retryAfterMs, 1500);
    assert.equal(bp.depth, 10);
    assert.equal(bp.limit, 10);
    const co = errorForProblem({ type: P + "circuit-open", detail: "open", retry_after: 4 }, 503);
    assert.ok(co instanceof CircuitOpen);
    assert.equal(co.retryAfterMs, 4000);
    const ov = errorForProblem({ type: P + "overloaded", detail: "busy" }, 503, 3000);
    assert.ok(ov instanceof HubOverloaded && ov instanceof HubUnavailable);
    assert.equal(ov.retryAfterMs, 3000);
  });

  test("BusinessError keeps its code; a garbage code becomes 1 with the raw one kept", () => {
    const b = errorForProblem({ type: P + "business-error", detail: "no", code: 7 }, 422);
    assert.ok(b instanceof BusinessError);
    assert.equal(b.code, 7);
    const g = errorForProblem({ type: P + "business-error", detail: "no", code: "x" }, 422);
    assert.equal(g.code, 1);
    assert.equal(g.extra.raw_code, "x");
  });

  test("an unknown type is a ReachError with its type, status and detail kept", () => {
    const err = errorForProblem({ type: "urn:other:thing", detail: "odd", status: 418, n: 1 }, 418);
    assert.equal(err.constructor, ReachError);
    assert.equal(err.type, "urn:other:thing");
    assert.equal(err.status, 418);
    assert.equal(err.detail, "odd");
    assert.equal(err.extra.n, 1);
    const five = errorForProblem({ detail: "boom" }, 502);
    assert.ok(five instanceof HubUnavailable);
    assert.equal(five.status, 502);
    assert.equal(errorForProblem({}, 400).message, "HTTP 400");
  });

  test("a 401/403 without a security type is still a security error (a proxy said it)", () => {
    assert.ok(errorForProblem({ detail: "go away" }, 401) instanceof Unauthenticated);
    assert.ok(errorForProblem({ type: "urn:proxy:denied" }, 403) instanceof Forbidden);
    assert.equal(errorForProblem({ type: "urn:proxy:denied" }, 403).type, "urn:proxy:denied");
  });
});

describe("outcome of a terminal task view", () => {
  const view = (status, error, extra = {}) => ({ task_id: "t-1", status, attempt_seq: 1, error, ...extra });

  test("success gives the data", () => {
    const r = outcome(view("success", null, { result: { a: 1 }, agent_id: "a", instance_id: "i" }));
    assert.deepEqual(r.data, { a: 1 });
    assert.equal(r.agentId, "a");
    assert.equal(r.attemptSeq, 1);
  });

  test("each failure is its typed error", () => {
    assert.throws(() => outcome(view("failed", { code: 7, message: "no" })), (e) => e instanceof BusinessError && e.code === 7 && e.message === "no");
    assert.throws(
      () => outcome(view("failed", { kind: "approval_rejected", decided_by: "ann", reason: "risky" })),
      (e) => e instanceof ApprovalRejected && e.extra.reason === "risky" && e.extra.decided_by === "ann",
    );
    assert.throws(() => outcome(view("dead", { kind: "agent_timeout", reason: "retries" })), (e) => e instanceof DeadLettered && e.extra.cause === "agent_timeout");
    assert.throws(
      () => outcome(view("cancelled", { kind: "session_closed", session_id: "s" })),
      (e) => e instanceof SessionClosed && e.extra.session_id === "s",
    );
    assert.throws(() => outcome(view("cancelled", null)), (e) => e.constructor === ReachError);
  });
});

describe("SSE parsing", () => {
  test("events split across chunks, CRLF, comments, multi-line data and ids", () => {
    const p = new SseParser();
    const got = [
      ...p.feed(": ping\r\nretry: 100\r\nevent: state\r\nid: 1\r\nda"),
      ...p.feed('ta: {"a":\r'),
      ...p.feed("\ndata: 1}\r\n\r"),
      ...p.feed("\n\nevent: result\nid: 2\ndata: {}\n\nevent: partial\ndata: x\n"),
    ];
    assert.deepEqual(got, [
      { event: "state", data: '{"a":\n1}', id: "1" },
      { event: "result", data: "{}", id: "2" },
    ]);
  });

  test("a multi-byte character split between chunks survives", async () => {
    const bytes = new TextEncoder().encode('data: "é"\n\n');
    const cut = bytes.indexOf(0xc3) + 1;
    const events = [];
    for await (const e of parseSse([bytes.slice(0, cut), bytes.slice(cut)])) events.push(e);
    assert.deepEqual(events, [{ event: "message", data: '"é"', id: null }]);
  });

  test("final events", () => {
    assert.equal(new StreamEvent("result", {}, 3).final, true);
    assert.equal(new StreamEvent("complete", {}, 3).final, true);
    assert.equal(new StreamEvent("state", { status: "success" }, 1).final, true);
    assert.equal(new StreamEvent("state", { status: "pending" }, 1).final, false);
    assert.equal(new StreamEvent("progress", { progress: 1 }, 2).final, false);
  });
});

describe("the HTTP client's edge (a real local server)", () => {
  const KEY = "rk_abc123_s3cr3tS3cr3t";
  let server;
  let url;
  const seen = [];

  before(async () => {
    server = createServer((req, res) => {
      seen.push({ url: req.url, auth: req.headers.authorization });
      if (req.url.startsWith("/html")) {
        res.writeHead(200, { "content-type": "text/html" }).end("<html>proxy</html>");
      } else if (req.url.startsWith("/array")) {
        res.writeHead(200, { "content-type": "application/json" }).end("[1]");
      } else if (req.url.startsWith("/echo-key")) {
        res.writeHead(400, { "content-type": "application/problem+json" });
        res.end(JSON.stringify({ type: P + "malformed-request", detail: `bad key ${KEY}`, nested: [KEY] }));
      } else if (req.url.startsWith("/busy")) {
        res.writeHead(503, { "content-type": "text/plain", "retry-after": "7" }).end("busy");
      } else if (req.url.startsWith("/slow")) {
        setTimeout(() => res.writeHead(200).end("{}"), 2_000);
      } else {
        res.writeHead(200, { "content-type": "application/json" }).end('{"ok": true}');
      }
    });
    await new Promise((r) => server.listen(0, "127.0.0.1", r));
    url = `http://127.0.0.1:${server.address().port}`;
  });

  after(() => {
    server.closeAllConnections();
    server.close();
  });

  test("sends the key as a bearer token, from the option or $REACH_API_KEY", async () => {
    assert.deepEqual(await new HubClient({ hub: url, apiKey: KEY }).get("/ok", { query: { wait: 1, no: undefined } }), { ok: true });
    assert.equal(seen.at(-1).auth, `Bearer ${KEY}`);
    assert.equal(seen.at(-1).url, "/ok?wait=1");
    process.env.REACH_API_KEY = "rk_env_key";
    try {
      await new HubClient({ hub: url }).get("/ok");
      assert.equal(seen.at(-1).auth, "Bearer rk_env_key");
      await new HubClient({ hub: url, apiKey: "" }).get("/ok");
      assert.equal(seen.at(-1).auth, undefined);
    } finally {
      delete process.env.REACH_API_KEY;
    }
  });

  test("the hub URL defaults to $REACH_HUB_URL, else 127.0.0.1:8800", () => {
    assert.equal(new HubClient().baseUrl, "http://127.0.0.1:8800");
    process.env.REACH_HUB_URL = url + "/";
    try {
      assert.equal(new HubClient().baseUrl, url);
    } finally {
      delete process.env.REACH_HUB_URL;
    }
  });

  test("a success without a JSON object is a ProtocolError", async () => {
    const c = new HubClient({ hub: url });
    await assert.rejects(c.get("/html"), (e) => e instanceof ProtocolError && /not JSON/.test(e.message));
    await assert.rejects(c.get("/array"), (e) => e instanceof ProtocolError && /array/.test(e.message));
    await assert.rejects(c.get("/ok", { keys: ["task_id"] }), (e) => e instanceof ProtocolError && /without task_id/.test(e.message));
  });

  test("a key echoed by the server is scrubbed from the error", async () => {
    const err = await new HubClient({ hub: url, apiKey: KEY }).get("/echo-key").catch((e) => e);
    assert.ok(err instanceof ReachError);
    assert.ok(!JSON.stringify({ m: err.message, e: err.extra, s: String(err), st: err.stack }).includes("s3cr3t"));
    assert.match(err.message, /rk_abc123_…/);
  });

  test("a 5xx that is not a problem is HubUnavailable, with Retry-After", async () => {
    const err = await new HubClient({ hub: url }).get("/busy").catch((e) => e);
    assert.ok(err instanceof HubUnavailable);
    assert.equal(err.retryAfterMs, 7000);
  });

  test("a refused connection or a timeout is HubUnavailable, without the key", async () => {
    const srv = createServer();
    await new Promise((r) => srv.listen(0, "127.0.0.1", r));
    const port = srv.address().port;
    await new Promise((r) => srv.close(r));
    const refused = await new HubClient({ hub: `http://127.0.0.1:${port}`, apiKey: KEY }).get("/x").catch((e) => e);
    assert.ok(refused instanceof HubUnavailable);
    assert.match(refused.message, /unreachable/);
    assert.ok(!refused.message.includes(KEY));
    const slow = await new HubClient({ hub: url, timeoutMs: 200 }).get("/slow").catch((e) => e);
    assert.ok(slow instanceof HubUnavailable);
    assert.match(slow.message, /did not answer in time/);
  });

  test("a key with whitespace inside is refused without echoing it", () => {
    assert.throws(() => resolveApiKey("rk_a_b c"), (e) => e instanceof ConfigError && !e.message.includes("b c"));
    assert.equal(resolveApiKey("  rk_a_b\n"), "rk_a_b");
    assert.equal(redact(`x ${KEY} y`, KEY), "x rk_abc123_… y");
    assert.ok(!String(new HubClient({ hub: url, apiKey: KEY })).includes(KEY));
  });
});

test("a method that is a path is refused before anything is sent (issue 37)", async () => {
  const srv = createServer();
  await new Promise((r) => srv.listen(0, "127.0.0.1", r));
  const nobody = `http://127.0.0.1:${srv.address().port}`;
  await new Promise((r) => srv.close(r)); // a request would be HubUnavailable
  for (const method of ["x/../../p", "../admin", "a/./b", "a//b"]) {
    const sent = await send({ agentId: "a", method, hub: nobody }).catch((e) => e);
    assert.ok(sent instanceof InvalidTaskRequest, `${method}: ${sent}`);
    assert.match(sent.message, /not a name/);
    assert.equal(sent.extra.field, "method");
    const cast = await broadcast({ capability: "c", method, hub: nobody }).catch((e) => e);
    assert.ok(cast instanceof InvalidTaskRequest, `${method}: ${cast}`);
  }
});

test("ResultTimeout and LoopDetected are ReachErrors with their slugs", () => {
  assert.equal(new ResultTimeout("t").type, P + "result-timeout");
  assert.equal(new LoopDetected("l").status, 508);
  assert.equal(new InvalidPayload("p").status, 422);
});

describe("stream reconnects (a real local SSE server that drops the connection)", () => {
  test("resumes with Last-Event-ID: every event once, in order, then ends", async () => {
    const asked = [];
    const server = createServer((req, res) => {
      asked.push(req.headers["last-event-id"] ?? null);
      res.writeHead(200, { "content-type": "text/event-stream" });
      if (asked.length === 1) {
        res.write('event: state\nid: 1\ndata: {"status": "executing"}\n\n');
        res.write('event: progress\nid: 2\ndata: {"progress": 0.5}\n\n');
        res.write("event: progress\nid: 3\ndata: {\"progr"); // cut mid-event
        setTimeout(() => res.destroy(), 50);
      } else {
        res.write(": ping\n\n");
        res.write('event: progress\nid: 3\ndata: {"progress": 1}\n\n');
        res.write('event: result\nid: 4\ndata: {"status": "success"}\n\n');
        res.end();
      }
    });
    await new Promise((r) => server.listen(0, "127.0.0.1", r));
    try {
      const events = [];
      for await (const e of streamPath("/s", { hub: `http://127.0.0.1:${server.address().port}`, timeoutMs: 10_000 })) {
        events.push([e.kind, e.id]);
      }
      assert.deepEqual(events, [["state", 1], ["progress", 2], ["progress", 3], ["result", 4]]);
      assert.deepEqual(asked, [null, "2"]);
    } finally {
      server.closeAllConnections();
      server.close();
    }
  });

  test("a problem answer ends the stream with its typed error; a timeout is ResultTimeout", async () => {
    const server = createServer((req, res) => {
      if (req.url === "/gone") {
        res.writeHead(404, { "content-type": "application/problem+json" });
        res.end(JSON.stringify({ type: P + "unknown-task", detail: "no such task" }));
      } else {
        res.writeHead(200, { "content-type": "text/event-stream" });
        res.write(": ping\n\n"); // and then silence
      }
    });
    await new Promise((r) => server.listen(0, "127.0.0.1", r));
    const hub = `http://127.0.0.1:${server.address().port}`;
    try {
      await assert.rejects(async () => {
        for await (const _ of streamPath("/gone", { hub })) break;
      }, (e) => e.constructor.name === "UnknownTask" && e.message === "no such task");
      await assert.rejects(async () => {
        for await (const _ of streamPath("/quiet", { hub, timeoutMs: 300 })) break;
      }, ResultTimeout);
    } finally {
      server.closeAllConnections();
      server.close();
    }
  });
});
