/**
 * The agent SDK for Node.js: register with the hub, heartbeat, serve handlers over HTTP,
 * with the same concepts and names as the Python SDK (`reach/sdk/agent.py`).
 *
 *     const agent = new Agent({ agentId: "echo", addr: "127.0.0.1:7001", allowLoopback: true });
 *     agent.route("echo", (taskId, payload) => payload);
 *     await agent.serve();              // its own HTTP server, until SIGINT/SIGTERM
 *
 * or mount `agent.handler()` into node:http / Express (`app.use("/reach", agent.handler())`
 * with `addr: "http://host:port/reach"`), or `agent.fetch` into a fetch-style framework
 * (Hono), after `await agent.join()` (register + heartbeats without a server).
 *
 * Heartbeats run in a worker thread with its own event loop, fed the load through shared
 * memory: a handler that hogs the main event loop (a synchronous loop) cannot stop the hub
 * from hearing that the process is alive, and the load it reports (in_flight up while
 * heartbeats stay fresh) is how the hub tells "alive" from "able to take work". At most
 * `maxConcurrency` handlers run at once; a delivery beyond it is answered 429 at once.
 *
 * Every delivery's reach token is checked first (`TokenVerifier`): a missing, forged,
 * expired, replayed or misaddressed one gets 401 and the handler never runs. A task
 * delivered twice (same `task_id`) runs once: the dedup guard answers the copy.
 *
 * Handlers may think for minutes: a delivery is answered 202 once its handler has run
 * `acceptAfterMs` (10 s by default), and the SDK keeps the hub's watchdog off with
 * keepalives and reports the outcome when the handler ends (`running.ts`), so an author
 * writes an async function and returns its value. Its value must be JSON.
 */

import { randomUUID } from "node:crypto";
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import { MessageChannel, Worker } from "node:worker_threads";

import { AgentChannel } from "./channel.js";
import { type Answer, IdempotencyGuard, DEFAULT_MAX_BYTES, DEFAULT_TTL_MS } from "./dedup.js";
import { BusinessError, HubUnavailable, InvalidRegistration, StaleReport, UnknownInstance } from "./errors.js";
import { HubClient, resolveApiKey } from "./http.js";
import { nameRefusal } from "./names.js";
import {
  DEFAULT_ACCEPT_AFTER_MS,
  DEFAULT_BUDGET_MS,
  REPORT_BACKOFF_FIRST_MS,
  REPORT_BACKOFF_MAX_MS,
  REPORT_PATIENCE_MS,
  acceptWaitMs,
  accepted,
  keepaliveIntervalMs,
  notJson,
  notJsonAnswer,
  reportOf,
} from "./running.js";
import { TokenVerifier } from "./tokens.js";

export const MAX_REQUEST_BYTES = 1_048_576;
/** A channel agent's placeholder addr: the hub sets its own endpoint. */
export const CHANNEL_ADDR = "http://127.0.0.1:9";
export const CLOSED_SESSIONS_HEADER = "X-Reach-Closed-Sessions";
const REMEMBERED_ATTEMPTS = 10_000;

/** Returned by a handler that will report its result later (the hub sees 202). */
export const ACCEPTED: unique symbol = Symbol.for("reach.ACCEPTED");

/** What a handler learns of the delivery besides its task id and payload. */
export interface Delivery {
  taskId: string;
  method: string;
  attemptSeq: number | undefined;
  sessionId: string | undefined;
  /** When the hub wants the answer by, in epoch ms (as `Date.now()`), if it said. */
  deadline: number | undefined;
  /** The trace context the hub delivered (root, hops, path). */
  trace: unknown;
  /** The trace a reach sent from this handler carries: `send({ ..., trace: delivery.childTrace })`
   * keeps a chain of agents one story and lets the hub see loops. */
  childTrace: { root_id: string; parent_task_id: string; hops: number; path: string[] };
  /** The delivery's W3C trace context (OpenTelemetry), if the hub sent one: pass it on,
   * `send({ ..., trace: delivery.childTrace, traceparent: delivery.traceparent })`, and a
   * reach made here joins the caller's trace. */
  traceparent: string | undefined;
  /** The whole body the hub delivered. */
  body: Record<string, unknown>;
}

export type Handler = (taskId: string, payload: Record<string, unknown>, delivery: Delivery) => unknown;

export interface Capability {
  type: string;
  description?: string;
  params_schema?: Record<string, unknown>;
  return_schema?: Record<string, unknown> | null;
  estimated_latency?: number | null;
  danger_level?: "low" | "medium" | "high";
  require_approval?: boolean;
}

export interface AgentOptions {
  agentId: string;
  tags?: string[];
  /** Where the agent binds and the hub reaches it: `host:port` or `http://host:port/path`. */
  addr?: string;
  /** The address the hub should dial, when it differs from `addr` (NAT, proxy). */
  publicEndpoint?: string;
  capabilities?: Capability[];
  maxConcurrency?: number;
  /** Milliseconds between heartbeats (10 000); the hub takes 50 ms to 1 h. */
  heartbeatInterval?: number;
  /** The hub's base URL; default `$REACH_HUB_URL`, else `http://127.0.0.1:8800`. */
  hub?: string;
  /** This agent's credential (default `$REACH_API_KEY`). */
  apiKey?: string;
  /** Permit a loopback `addr` (local development). */
  allowLoopback?: boolean;
  metadata?: Record<string, string | number | boolean>;
  version?: string;
  instanceId?: string;
  /** At most this many of this agent's tasks pending or in flight at the hub. */
  maxQueue?: number;
  /** Check the hub's reach token of every delivery (true); off only without a hub. */
  verifyTokens?: boolean;
  /** Take deliveries over a WebSocket to the hub; the default when no `addr` is given. */
  channel?: boolean;
  dedup?: IdempotencyGuard;
  dedupMaxBytes?: number;
  /** Milliseconds an answer is kept for redeliveries (a day). */
  dedupTtlMs?: number;
  timeoutMs?: number;
  /** Milliseconds a delivery waits for its handler (10 000; or half the time left before
   * the delivery's deadline, if sooner) before it is answered 202: the handler goes on,
   * keepalives hold the hub's watchdog off, and its outcome is reported when it ends.
   * null: always answer when the handler ends. */
  acceptAfterMs?: number | null;
}

/** A handler run: its outcome once it ends; reported to the hub once a delivery of it was
 * answered 202 (`accepted`). */
interface Run {
  delivery: Delivery;
  arrived: number;
  accepted: boolean;
  done: Promise<{ answer: Answer; failed: boolean }>;
}

/** The registration body (`POST /v1/agents/register`), as the Python SDK sends it. */
export interface Declaration {
  agent_id: string;
  instance_id: string;
  addr: string;
  public_endpoint: string | null;
  tags: string[];
  capabilities: Capability[];
  metadata: Record<string, string | number | boolean>;
  max_concurrency: number;
  max_queue: number | null;
  heartbeat_interval: number;
  allow_loopback: boolean;
  version: string;
}

interface Endpoint {
  scheme: string;
  host: string;
  port: number;
  path: string;
}

/** `host:port` or `scheme://host:port/path`, as the hub reads an addr. */
export function parseEndpoint(addr: string): Endpoint {
  const withScheme = /^[a-z][a-z0-9+.-]*:\/\//i.test(addr) ? addr : `http://${addr}`;
  let url: URL;
  try {
    url = new URL(withScheme);
  } catch {
    throw new InvalidRegistration(`addr: not host:port or a URL: ${JSON.stringify(addr)}`);
  }
  const port = Number(url.port || (url.protocol === "https:" ? 443 : 80));
  return {
    scheme: url.protocol.slice(0, -1),
    host: url.hostname.replace(/^\[|\]$/g, ""),
    port,
    path: url.pathname.replace(/\/+$/, ""),
  };
}

import { FAILURES, IN_FLIGHT, LAST_US, REGISTERED, runHeartbeat, type HeartbeatData } from "./heartbeat.js";

/** One instance of an agent: its declaration, its heartbeat and its HTTP surface. */
export class Agent {
  readonly declaration: Declaration;
  readonly channel: boolean;
  readonly hub: HubClient;
  readonly tokens: TokenVerifier | null;
  readonly dedup: IdempotencyGuard;
  /** Sessions the hub said are closed among this instance's in-flight tasks. */
  readonly closedSessions = new Set<string>();
  private readonly apiKey: string | undefined;
  private readonly routes = new Map<string, Handler>();
  private readonly attempts = new Map<string, number>();
  private readonly runs = new Map<string, Run>();
  private readonly acceptAfterMs: number | null;
  private readonly shared = new Int32Array(new SharedArrayBuffer(16));
  private readonly root: string;
  private worker: Worker | null = null;
  private inThread: (() => void) | null = null;
  private server: Server | null = null;
  private channelConn: AgentChannel | null = null;
  private stopped: Promise<void> | null = null;
  private stopResolve: (() => void) | null = null;
  // A register the hub may have committed though its answer never came (a timeout):
  // the instance is deregistered on the way out all the same.
  private registerSent = false;
  private signalHandler: (() => void) | null = null;
  /** Heartbeats the hub acknowledged (tests and logs). */
  heartbeats = 0;

  constructor(opts: AgentOptions) {
    let { addr, publicEndpoint, allowLoopback } = opts;
    const channel = opts.channel ?? !addr;
    if (!addr && !channel) throw new InvalidRegistration("addr is required: the host:port the agent binds to");
    if (channel) {
      addr = CHANNEL_ADDR;
      publicEndpoint = undefined;
      allowLoopback = true;
    }
    this.channel = channel;
    const maxConcurrency = opts.maxConcurrency ?? 8;
    if (!Number.isInteger(maxConcurrency) || maxConcurrency < 1) {
      throw new InvalidRegistration("max_concurrency: must be a positive integer");
    }
    const heartbeatMs = opts.heartbeatInterval ?? 10_000;
    if (!(heartbeatMs >= 50 && heartbeatMs <= 3_600_000)) {
      throw new InvalidRegistration(
        `heartbeat_interval: heartbeatInterval is in milliseconds, from 50 to 3600000; got ${heartbeatMs}`,
      );
    }
    this.root = parseEndpoint(addr!).path;
    this.declaration = {
      agent_id: opts.agentId,
      instance_id: opts.instanceId ?? randomUUID().replace(/-/g, ""),
      addr: addr!,
      public_endpoint: publicEndpoint ?? null,
      tags: [...(opts.tags ?? [])].sort(),
      capabilities: opts.capabilities ?? [],
      metadata: opts.metadata ?? {},
      max_concurrency: maxConcurrency,
      max_queue: opts.maxQueue ?? null,
      heartbeat_interval: heartbeatMs / 1000,
      allow_loopback: allowLoopback ?? false,
      version: opts.version ?? "",
    };
    this.apiKey = resolveApiKey(opts.apiKey);
    this.hub = new HubClient({ hub: opts.hub, apiKey: this.apiKey ?? "", timeoutMs: opts.timeoutMs });
    this.tokens = opts.verifyTokens === false ? null : new TokenVerifier(this.hub.baseUrl, opts.agentId);
    const acceptAfterMs = opts.acceptAfterMs === undefined ? DEFAULT_ACCEPT_AFTER_MS : opts.acceptAfterMs;
    if (acceptAfterMs !== null && !(acceptAfterMs >= 0)) {
      throw new RangeError("acceptAfterMs must be null or a number of milliseconds >= 0");
    }
    this.acceptAfterMs = acceptAfterMs;
    this.dedup =
      opts.dedup ??
      new IdempotencyGuard({ maxBytes: opts.dedupMaxBytes ?? DEFAULT_MAX_BYTES, ttlMs: opts.dedupTtlMs ?? DEFAULT_TTL_MS });
    Atomics.store(this.shared, LAST_US, -1);
  }

  // -- identity -------------------------------------------------------------------------
  get agentId(): string {
    return this.declaration.agent_id;
  }

  get instanceId(): string {
    return this.declaration.instance_id;
  }

  get inFlight(): number {
    return Atomics.load(this.shared, IN_FLIGHT);
  }

  get registered(): boolean {
    return Atomics.load(this.shared, REGISTERED) === 1;
  }

  /** @internal set by the channel once the hub welcomed it. */
  markRegistered(yes: boolean): void {
    Atomics.store(this.shared, REGISTERED, yes ? 1 : 0);
  }

  /** The `attempt_seq` of the latest delivery of `taskId` this instance got, if any. */
  acceptedAttempt(taskId: string): number | undefined {
    return this.attempts.get(taskId);
  }

  private rememberAttempt(taskId: string, body: Record<string, unknown>): void {
    const seq = body["attempt_seq"];
    if (typeof seq !== "number" || !Number.isInteger(seq)) return;
    const old = this.attempts.get(taskId);
    this.attempts.delete(taskId);
    this.attempts.set(taskId, Math.max(seq, old ?? seq)); // the newest attempt is the one the hub waits on
    if (this.attempts.size > REMEMBERED_ATTEMPTS) {
      const oldest = this.attempts.keys().next().value;
      if (oldest !== undefined) this.attempts.delete(oldest);
    }
  }

  // -- handlers -------------------------------------------------------------------------
  /** Register `handler(taskId, payload, delivery)` for `method`; it may be async. */
  route(method: string, handler: Handler): this {
    const why = nameRefusal(method);
    if (why !== null) throw new Error(why); // the hub would never deliver to it: say so now
    if (this.routes.has(method)) throw new Error(`method '${method}' already has a handler`);
    this.routes.set(method, handler);
    return this;
  }

  // -- hub conversation -----------------------------------------------------------------
  /** Register this instance with the hub (idempotent: safe to call again). */
  async register(): Promise<Record<string, unknown>> {
    this.registerSent = true;
    const answer = await this.hub.post<Record<string, unknown>>("/v1/agents/register", this.declaration);
    this.markRegistered(true);
    return answer;
  }

  /** Deregister this instance (a hub that forgot it already is not an error). */
  async deregister(): Promise<void> {
    if (!this.registered && !this.registerSent) return;
    try {
      await this.hub.post("/v1/agents/deregister", { agent_id: this.agentId, instance_id: this.instanceId });
    } catch (err) {
      if (!(err instanceof UnknownInstance)) throw err;
    }
    this.markRegistered(false);
    this.registerSent = false;
  }

  /** Start the heartbeat thread (heartbeats every `heartbeatInterval` ms). */
  startHeartbeat(opts: { thread?: boolean } = {}): void {
    if (this.worker !== null || this.inThread !== null) return;
    const data: HeartbeatData & { reachHeartbeat: true } = {
      reachHeartbeat: true,
      hub: this.hub.baseUrl,
      apiKey: this.apiKey ?? "",
      declaration: this.declaration,
      interval: this.declaration.heartbeat_interval,
      timeoutMs: this.hub.timeoutMs,
      shared: this.shared.buffer as SharedArrayBuffer,
    };
    if (opts.thread === false) return this.heartbeatInThread(data);
    let worker: Worker;
    try {
      worker = new Worker(new URL("./heartbeat.js", import.meta.url), {
        // flags of the main script (`--input-type` with `-e`) are not for this file
        execArgv: process.execArgv.filter((arg) => !arg.startsWith("--input-type")),
        workerData: data,
      });
    } catch (err) {
      console.warn(`reach: no heartbeat thread for ${this.agentId} (${String(err)}): heartbeats on the main thread`);
      return this.heartbeatInThread(data);
    }
    worker.on("message", (m) => this.onHeartbeat(m));
    worker.on("error", (err) => {
      // e.g. a bundle without dist/heartbeat.js: heartbeats go on, on the main thread
      console.error(`reach: heartbeat thread of ${this.agentId} failed (${String(err)}): heartbeats on the main thread`);
      if (this.worker === worker) {
        this.worker = null;
        this.heartbeatInThread(data);
      }
    });
    worker.unref();
    this.worker = worker;
  }

  private heartbeatInThread(data: HeartbeatData): void {
    const { port1, port2 } = new MessageChannel();
    port2.on("message", (m) => this.onHeartbeat(m));
    port1.unref();
    port2.unref();
    const stop = runHeartbeat(data, port1, true);
    this.inThread = () => {
      stop();
      port2.close();
    };
  }

  private onHeartbeat(m: { beat?: boolean; closed?: string; warning?: string; error?: string }): void {
    if (m.beat) {
      this.heartbeats += 1;
      for (const part of (m.closed ?? "").split(",")) {
        try {
          const id = decodeURIComponent(part.trim());
          if (id) this.closedSessions.add(id);
        } catch {
          // not percent-encoding: not a session id this SDK sent
        }
      }
    }
    if (m.warning) console.warn(`reach: ${this.agentId}: ${this.hub.redact(m.warning)}`);
    if (m.error) console.error(`reach: ${this.agentId}: ${this.hub.redact(m.error)}`);
  }

  /** Whether heartbeats run in their own thread (false: the main-thread fallback). */
  get heartbeatThread(): boolean {
    return this.worker !== null;
  }

  async stopHeartbeat(): Promise<void> {
    const worker = this.worker;
    this.worker = null;
    if (worker !== null) await worker.terminate();
    const stop = this.inThread;
    this.inThread = null;
    stop?.();
  }

  /** Register (a hub that is down is waited for: heartbeats register later) and heartbeat;
   * for an agent whose HTTP surface is mounted elsewhere (`handler()`, `fetch`). */
  async join(): Promise<void> {
    try {
      if (!this.registered) await this.register();
    } catch (err) {
      if (!(err instanceof HubUnavailable)) throw err;
      console.warn(`reach: hub unavailable, ${this.agentId} registers when it answers: ${err.message}`);
    }
    this.startHeartbeat();
  }

  // -- serving --------------------------------------------------------------------------
  /** Bind the HTTP server (or open the channel), register and heartbeat; resolves once up. */
  async start(): Promise<void> {
    this.stopped ??= new Promise<void>((resolve) => (this.stopResolve = resolve));
    if (this.channel) {
      if (this.channelConn === null) {
        this.channelConn = new AgentChannel(this, this.hub.baseUrl, this.apiKey);
        await this.channelConn.start();
      }
      return;
    }
    if (this.server === null) {
      const bind = parseEndpoint(this.declaration.addr);
      const server = createServer(this.handler());
      server.keepAliveTimeout = 30_000;
      await new Promise<void>((resolve, reject) => {
        server.once("error", reject);
        server.listen(bind.port, bind.host, () => {
          server.off("error", reject);
          resolve();
        });
      });
      this.server = server;
    }
    try {
      await this.join();
    } catch (err) {
      await this.closeServer();
      throw err;
    }
  }

  /** Serve until SIGINT/SIGTERM (or `close()`), then deregister; resolves when closed. */
  async serve(opts: { signals?: boolean } = {}): Promise<void> {
    // The handlers go in before registering: the hub lists the instance once it commits
    // the registration, so a supervisor may stop it before `register` has answered, and
    // Node's default for SIGTERM would end the process still registered.
    let starting = true;
    let stopAsked = false;
    if (opts.signals !== false && this.signalHandler === null) {
      const onSignal = (): void => {
        if (starting) stopAsked = true;
        else void this.close();
      };
      this.signalHandler = onSignal;
      process.once("SIGINT", onSignal);
      process.once("SIGTERM", onSignal);
    }
    try {
      await this.start();
    } catch (err) {
      this.dropSignalHandler();
      throw err;
    } finally {
      starting = false;
    }
    const stopped = this.stopped;
    if (stopAsked) await this.close();
    await stopped;
  }

  /** The port the built-in server listens on (useful with port 0). */
  get port(): number | undefined {
    const address = this.server?.address();
    return address && typeof address === "object" ? address.port : undefined;
  }

  /** Stop serving and heartbeating, then deregister this instance. */
  async close(): Promise<void> {
    this.dropSignalHandler();
    await this.stopHeartbeat();
    await this.closeServer();
    try {
      await this.deregister();
    } catch (err) {
      console.warn(`reach: could not deregister ${this.agentId}: ${(err as Error).message}`);
    }
    this.stopResolve?.();
    this.stopped = null;
    this.stopResolve = null;
  }

  private dropSignalHandler(): void {
    if (this.signalHandler === null) return;
    process.off("SIGINT", this.signalHandler);
    process.off("SIGTERM", this.signalHandler);
    this.signalHandler = null;
  }

  private async closeServer(): Promise<void> {
    if (this.channelConn !== null) {
      await this.channelConn.stop();
      this.channelConn = null;
    }
    const server = this.server;
    this.server = null;
    if (server !== null) {
      await new Promise<void>((resolve) => {
        server.close(() => resolve());
        server.closeAllConnections();
      });
    }
  }

  /** A request handler for node:http or Express (`(req, res, next?)`): serves
   * `GET /healthz` and `POST /tasks/{method}` (under the addr's path, if any). */
  handler(): (req: IncomingMessage, res: ServerResponse, next?: (err?: unknown) => void) => void {
    return (req, res, next) => {
      this.serveNode(req, res, next).catch((err: unknown) => {
        // the peer left mid-body, or a bug: never an unhandled rejection in the host app
        if (!res.headersSent) {
          const data = JSON.stringify({ code: 400, message: `request not readable: ${(err as Error)?.message ?? err}` });
          res.writeHead(400, { "Content-Type": "application/json", "Content-Length": Buffer.byteLength(data) });
          res.end(data);
        } else res.destroy();
      });
    };
  }

  private async serveNode(req: IncomingMessage, res: ServerResponse, next?: (err?: unknown) => void): Promise<void> {
    const path = below(decodedPath(req.url ?? "/") ?? "", this.root);
    const verb = req.method ?? "GET";
    let answer: Answer;
    if (!path) {
      answer = [400, { code: 400, message: "path is not valid percent-encoding" }];
    } else if (verb === "GET" && path === "/healthz") {
      answer = [200, this.health()];
    } else if (verb !== "POST" || !path.startsWith("/tasks/")) {
      if (next) return next();
      answer = [404, { code: 404, message: "not found" }];
    } else {
      const declared = Number(req.headers["content-length"] ?? 0);
      if (!Number.isFinite(declared) || declared < 0) {
        answer = [400, { code: 400, message: "Content-Length is not a number" }];
      } else if (declared > MAX_REQUEST_BYTES) {
        answer = [413, { code: 413, message: "request body too large" }];
        res.setHeader("Connection", "close");
      } else {
        // a body parser ahead of us (express.json()) already read it: take the bytes it
        // kept (`verify: (req, _res, buf) => { req.rawBody = buf }`), which the reach token
        // binds; its object re-encoded matches them only when the hub's encoding survives
        // the round trip (compact ASCII JSON, keys in order, no 1.0-style numbers)
        const { body: parsed, rawBody } = req as IncomingMessage & { body?: unknown; rawBody?: unknown };
        const raw = Buffer.isBuffer(rawBody)
          ? rawBody
          : parsed !== null && typeof parsed === "object" && !Buffer.isBuffer(parsed)
            ? Buffer.from(JSON.stringify(parsed))
            : Buffer.isBuffer(parsed)
              ? parsed
              : await readBody(req);
        answer =
          raw === null
            ? [413, { code: 413, message: "request body too large" }]
            : await this.call(path.slice("/tasks/".length), raw, header(req.headers.authorization));
      }
    }
    const data = JSON.stringify(answer[1]);
    res.writeHead(answer[0], { "Content-Type": "application/json", "Content-Length": Buffer.byteLength(data) });
    res.end(data);
  }

  /** A fetch-style handler (`Request` → `Response`), for Hono and the like. */
  fetch = async (request: Request): Promise<Response> => {
    const path = below(decodedPath(new URL(request.url).pathname) ?? "", this.root);
    let answer: Answer;
    if (!path) answer = [400, { code: 400, message: "path is not valid percent-encoding" }];
    else if (request.method === "GET" && path === "/healthz") answer = [200, this.health()];
    else if (request.method !== "POST" || !path.startsWith("/tasks/")) answer = [404, { code: 404, message: "not found" }];
    else {
      const raw = Buffer.from(await request.arrayBuffer());
      answer =
        raw.length > MAX_REQUEST_BYTES
          ? [413, { code: 413, message: "request body too large" }]
          : await this.call(path.slice("/tasks/".length), raw, request.headers.get("authorization"));
    }
    return new Response(JSON.stringify(answer[1]), {
      status: answer[0],
      headers: { "Content-Type": "application/json" },
    });
  };

  private health(): Record<string, unknown> {
    return { status: "ok", agent_id: this.agentId, instance_id: this.instanceId, in_flight: this.inFlight };
  }

  /** Parse a delivery's body, check its token, run it. */
  async call(method: string, raw: Buffer | string, authorization: string | null | undefined): Promise<Answer> {
    let body: unknown;
    try {
      body = JSON.parse(raw.length ? raw.toString() : "{}");
    } catch {
      return [400, { code: 400, message: "body is not JSON" }];
    }
    if (body === null || typeof body !== "object" || Array.isArray(body)) {
      return [400, { code: 400, message: "body must be a JSON object" }];
    }
    const refused = await this.admit(body as Record<string, unknown>, authorization, method, raw);
    if (refused !== null) return refused;
    return this.invoke(method, body as Record<string, unknown>);
  }

  /** Check a delivery's reach token: null to go on, else the answer to give instead.
   * `raw` is the body's bytes as received and `method` the one it was posted to: the
   * token binds both. */
  async admit(
    body: Record<string, unknown>,
    authorization: string | null | undefined,
    method: string,
    raw: Buffer | Uint8Array | string,
  ): Promise<Answer | null> {
    if (this.tokens === null) return null;
    const refusal = await this.tokens.check(authorization, body, method, raw);
    if (refusal === null) return null;
    console.warn(
      `reach: refused a delivery of task ${JSON.stringify(body["task_id"])} to ${this.agentId}: ` +
        `${refusal.message} (status ${refusal.status})`,
    );
    return refusal.answer();
  }

  /** Run one delivery (already admitted); returns (HTTP status, JSON envelope). */
  async invoke(method: string, body: Record<string, unknown>): Promise<Answer> {
    const handler = this.routes.get(method);
    if (handler === undefined) return [404, { code: 404, message: `no handler for method '${method}'` }];
    const taskId = body["task_id"];
    const payload = body["payload"] ?? {};
    if (typeof taskId !== "string" || !taskId || payload === null || typeof payload !== "object" || Array.isArray(payload)) {
      return [400, { code: 400, message: "body needs task_id (string) and payload (object)" }];
    }
    this.rememberAttempt(taskId, body); // before the handler: it may report at once
    const begin = this.dedup.begin(taskId);
    if (begin.action === "done") return begin.answer;
    if (begin.action === "running") {
      // a copy while the first one runs: wait as long as a delivery waits for its handler
      const finished = await within(begin.running.then(() => true), this.copyWaitMs(body));
      const answer = this.dedup.answerOf(taskId);
      if (answer !== undefined) return answer;
      if (finished) return [503, { code: -1, message: "first copy of this task failed; retry" }];
      const run = this.runs.get(taskId);
      if (run !== undefined) this.follow(run); // its report names this copy's attempt
      return accepted("already running");
    }
    if (this.inFlight >= this.declaration.max_concurrency) {
      this.dedup.finish(taskId, null, false);
      return [429, { code: 429, message: "agent at max_concurrency" }];
    }
    const session = body["session_id"];
    const delivery: Delivery = {
      taskId,
      method,
      attemptSeq: typeof body["attempt_seq"] === "number" ? body["attempt_seq"] : undefined,
      sessionId: typeof session === "string" && session ? session : undefined,
      deadline: typeof body["deadline"] === "number" ? body["deadline"] * 1000 : undefined,
      trace: body["trace"],
      childTrace: childTrace(body["trace"], taskId, this.agentId),
      traceparent: traceparentOf(body["trace"]),
      body,
    };
    const run = this.startRun(handler, payload as Record<string, unknown>, delivery);
    const wait = acceptWaitMs(this.acceptAfterMs, delivery.deadline, run.arrived);
    const ended = wait === null ? await run.done : await within(run.done, wait);
    if (ended !== null) return ended.answer;
    this.follow(run);
    return accepted();
  }

  /** Run `handler` (a slot is free): its outcome, counted in the load and kept by the
   * dedup guard (unless it failed: the hub's retry runs it again). */
  private startRun(handler: Handler, payload: Record<string, unknown>, delivery: Delivery): Run {
    const { taskId, method } = delivery;
    Atomics.add(this.shared, IN_FLIGHT, 1);
    const started = performance.now();
    const run = { delivery, arrived: Date.now(), accepted: false } as Run;
    this.runs.set(taskId, run);
    run.done = (async () => {
      let failed = false;
      let answer: Answer;
      try {
        const value = await handler(taskId, payload, delivery);
        const found = value === ACCEPTED ? null : notJson(value);
        if (found !== null) {
          failed = true;
          answer = notJsonAnswer(method, found);
          console.error(`reach: task ${taskId}: ${String(answer[1]["message"])}`);
        } else answer = value === ACCEPTED ? accepted() : [200, wrap(value)];
      } catch (err) {
        if (err instanceof BusinessError) {
          answer = [200, { code: err.code, message: err.message }];
        } else {
          failed = true;
          console.error(`reach: handler for ${method} failed on task ${taskId}:`, err);
          const name = err instanceof Error ? err.name : "Error";
          answer = [500, { code: -1, message: `${name}: ${err instanceof Error ? err.message : String(err)}` }];
        }
      } finally {
        Atomics.sub(this.shared, IN_FLIGHT, 1);
        Atomics.store(this.shared, LAST_US, Math.min(2 ** 31 - 1, Math.round((performance.now() - started) * 1000)));
      }
      Atomics.store(this.shared, FAILURES, failed ? Atomics.load(this.shared, FAILURES) + 1 : 0);
      // a transient failure is not remembered: the hub's retry must run the handler again
      this.dedup.finish(taskId, answer, !failed);
      if (this.runs.get(taskId) === run) this.runs.delete(taskId);
      return { answer, failed };
    })();
    return run;
  }

  /** A delivery of `run` was answered 202: keep the task alive at the hub until the
   * handler ends, then report its outcome. */
  private follow(run: Run): void {
    if (run.accepted) return;
    run.accepted = true;
    const deadline = run.delivery.deadline;
    const budget = deadline === undefined ? DEFAULT_BUDGET_MS : deadline - run.arrived;
    const keepalive = setInterval(() => void this.keepalive(run), keepaliveIntervalMs(budget));
    keepalive.unref();
    void run.done.then(async ({ answer, failed }) => {
      clearInterval(keepalive);
      await this.report(run, answer, failed);
    });
  }

  /** The attempt a report names: the latest delivered here (a copy that came while the
   * handler ran is the one the hub waits on), else the run's own. */
  private attemptOf(run: Run): number | undefined {
    return this.acceptedAttempt(run.delivery.taskId) ?? run.delivery.attemptSeq;
  }

  private async keepalive(run: Run): Promise<void> {
    const taskId = run.delivery.taskId;
    const seq = this.attemptOf(run);
    if (seq === undefined) return;
    try {
      await this.hub.post(`/v1/tasks/${encodeURIComponent(taskId)}/progress`, {
        attempt_seq: seq,
        instance_id: this.instanceId,
        keepalive: true,
      });
    } catch (err) {
      const why = this.hub.redact((err as Error).message);
      if (err instanceof StaleReport) console.info(`reach: keepalive of task ${taskId}: the hub moved on (${why})`);
      else console.warn(`reach: keepalive of task ${taskId} not taken: ${why}`);
    }
  }

  private async report(run: Run, answer: Answer, failed: boolean): Promise<void> {
    const taskId = run.delivery.taskId;
    const fields = reportOf(answer, failed);
    if (fields === null) return; // the handler returned ACCEPTED: it reports for itself
    const giveUp = Date.now() + REPORT_PATIENCE_MS;
    let pause = REPORT_BACKOFF_FIRST_MS;
    for (;;) {
      const seq = this.attemptOf(run);
      if (seq === undefined) {
        console.error(`reach: task ${taskId} ended after its 202, but its delivery named no attempt_seq: not reported`);
        return;
      }
      try {
        await this.postResult(taskId, seq, fields);
        return;
      } catch (err) {
        const why = this.hub.redact((err as Error).message);
        if (err instanceof StaleReport) {
          console.warn(`reach: report of task ${taskId} refused, the hub moved on: ${why}`);
          return;
        }
        if (!(err instanceof HubUnavailable) || Date.now() + pause > giveUp) {
          console.error(`reach: report of task ${taskId} lost: ${why}`);
          return;
        }
        console.warn(`reach: report of task ${taskId} waits for the hub (again in ${pause} ms): ${why}`);
        await sleep(pause);
        pause = Math.min(REPORT_BACKOFF_MAX_MS, pause * 2);
      }
    }
  }

  /** How long a copy of a running task waits for the first copy's answer, in ms. */
  private copyWaitMs(body: Record<string, unknown>): number {
    const deadline = typeof body["deadline"] === "number" ? body["deadline"] * 1000 : undefined;
    return acceptWaitMs(this.acceptAfterMs, deadline, Date.now()) ?? duplicateWait(body) * 1000;
  }

  // -- results after 202 ----------------------------------------------------------------
  /** Report the result of a task this agent accepted (its handler returned ACCEPTED);
   * true if this report decided the task. Names this instance and the attempt it was
   * delivered (the latest, or `attemptSeq`); the hub refuses a stale one (`StaleReport`). */
  async reportResult(
    taskId: string,
    data?: unknown,
    opts: { code?: number; message?: string; attemptSeq?: number; transient?: boolean } = {},
  ): Promise<boolean> {
    const seq = this.attemptToReport(taskId, opts.attemptSeq);
    const message = opts.message ?? "";
    if (opts.transient) {
      // a failure that may pass: the hub retries; the guard forgets the task to run it again
      this.dedup.finish(taskId, null, false);
      return this.postResult(taskId, seq, { code: opts.code || -1, message, transient: true });
    }
    const code = opts.code ?? 0;
    this.dedup.finish(taskId, [200, code === 0 ? { code, data: data ?? null } : { code, message }], true);
    return this.postResult(taskId, seq, { code, data, message });
  }

  /** `POST /v1/tasks/{id}/result` naming this instance and `seq`; true if it decided. */
  private async postResult(taskId: string, seq: number, fields: Record<string, unknown>): Promise<boolean> {
    const { code = 0, data, message = "", transient } = fields;
    const body: Record<string, unknown> = { code, data: data ?? null, message, attempt_seq: seq, instance_id: this.instanceId };
    if (transient) body["transient"] = true;
    const answer = await this.hub.post<{ decided: boolean }>(`/v1/tasks/${encodeURIComponent(taskId)}/result`, body, {
      keys: ["decided"],
    });
    return Boolean(answer.decided);
  }

  /** Report progress of an accepted task (named like a result). */
  async reportProgress(
    taskId: string,
    progress?: number,
    message = "",
    opts: { data?: unknown; attemptSeq?: number } = {},
  ): Promise<void> {
    const body: Record<string, unknown> = {
      message,
      attempt_seq: this.attemptToReport(taskId, opts.attemptSeq),
      instance_id: this.instanceId,
    };
    if (progress !== undefined) body["progress"] = progress;
    if (opts.data !== undefined) body["data"] = opts.data;
    await this.hub.post(`/v1/tasks/${encodeURIComponent(taskId)}/progress`, body);
  }

  private attemptToReport(taskId: string, attemptSeq: number | undefined): number {
    const seq = attemptSeq ?? this.acceptedAttempt(taskId);
    if (seq === undefined) {
      throw new StaleReport(
        `${this.agentId}/${this.instanceId} holds no delivery of task '${taskId}' ` +
          "(never delivered here, or forgotten): pass attemptSeq",
        { extra: { task_id: taskId } },
      );
    }
    return seq;
  }

  /** @internal the load a channel heartbeat carries. */
  load(): Record<string, unknown> {
    const inFlight = this.inFlight;
    const lastUs = Atomics.load(this.shared, LAST_US);
    return {
      current_load: inFlight / this.declaration.max_concurrency,
      in_flight: inFlight,
      max_concurrency: this.declaration.max_concurrency,
      last_task_duration_ms: lastUs < 0 ? null : lastUs / 1000,
      consecutive_failure_count: Atomics.load(this.shared, FAILURES),
      sent_at: Date.now() / 1000,
    };
  }
}

/** A handler's return as an envelope: an envelope (integer `code`) passes through. */
export function wrap(value: unknown): Record<string, unknown> {
  if (value !== null && typeof value === "object" && !Array.isArray(value)) {
    const code = (value as Record<string, unknown>)["code"];
    if (typeof code === "number" && Number.isInteger(code)) return { ...(value as Record<string, unknown>) };
  }
  return { code: 0, data: value === undefined ? null : value };
}

function childTrace(trace: unknown, taskId: string, agentId: string): Delivery["childTrace"] {
  const base = (trace !== null && typeof trace === "object" ? trace : {}) as Record<string, unknown>;
  const hops = typeof base["hops"] === "number" ? base["hops"] : 0;
  const path = Array.isArray(base["path"]) ? base["path"].map(String) : [];
  const root = typeof base["root_id"] === "string" && base["root_id"] ? base["root_id"] : taskId;
  return { root_id: root, parent_task_id: taskId, hops: hops + 1, path: [...path, agentId] };
}

const TRACEPARENT = /^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$/;

/** The W3C traceparent the hub put in the delivery's trace (signed with the body). */
function traceparentOf(trace: unknown): string | undefined {
  if (trace === null || typeof trace !== "object") return undefined;
  const value = (trace as Record<string, unknown>)["traceparent"];
  return typeof value === "string" && TRACEPARENT.test(value) ? value : undefined;
}

function decodedPath(url: string): string | null {
  try {
    return decodeURIComponent(url.split("?")[0] ?? "/");
  } catch {
    return null;
  }
}

function below(path: string, root: string): string {
  if (root && (path === root || path.startsWith(root + "/"))) return path.slice(root.length) || "/";
  return path;
}

function header(value: string | string[] | undefined): string | null {
  return Array.isArray(value) ? (value[0] ?? null) : (value ?? null);
}

function duplicateWait(body: Record<string, unknown>): number {
  const deadline = body["deadline"];
  if (typeof deadline === "number") return Math.max(0, Math.min(30, deadline - Date.now() / 1000));
  return 5;
}

function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms).unref());
}

/** `promise`'s value if it settles within `ms`, else null (its timer cleared either way). */
function within<T>(promise: Promise<T>, ms: number): Promise<T | null> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<null>((resolve) => {
    timer = setTimeout(() => resolve(null), ms);
    timer.unref();
  });
  return Promise.race([promise, late]).finally(() => clearTimeout(timer));
}

async function readBody(req: IncomingMessage): Promise<Buffer | null> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of req as AsyncIterable<Buffer>) {
    size += chunk.length;
    if (size > MAX_REQUEST_BYTES) return null;
    chunks.push(chunk);
  }
  return Buffer.concat(chunks);
}

export { TokenVerifier, Refusal, checkClaims, bodyDigest } from "./tokens.js";
export { IdempotencyGuard } from "./dedup.js";
export { AgentChannel } from "./channel.js";
