/**
 * The caller's SDK (the Node twin of `reach/sdk/caller.py`): send a task, wait for its
 * result, broadcast to every matching agent.
 *
 *     const sub = await send({ agentId: "doc-analyzer-01", method: "task.process", payload: { doc_id: "abc" } });
 *     const result = await waitForResult(sub.taskId, { timeoutMs: 60_000 });
 *
 * Errors are typed (see `errors.ts`): `NoSuitableAgent`, `InvalidPayload`, `Backpressure`
 * (never retried here: `retryAfterMs` says when to try again), `CircuitOpen`,
 * `LoopDetected`, `SessionClosed` at submit; `BusinessError` (the agent said no),
 * `DeadLettered`, `ApprovalRejected`, `ApprovalExpired`, `SessionClosed` and
 * `ResultTimeout` from `waitForResult`; `Unauthenticated` and `Forbidden` from any call.
 *
 * Every function takes `hub` and `apiKey` (defaults: `$REACH_HUB_URL`, `$REACH_API_KEY`).
 * Names follow the Python SDK in camelCase; every duration is in milliseconds.
 */

import {
  ApprovalExpired,
  ApprovalRejected,
  BusinessError,
  DeadLettered,
  InvalidTaskRequest,
  ReachError,
  ResultTimeout,
  SessionClosed,
} from "./errors.js";
import { HubClient } from "./http.js";
import { nameRefusal } from "./names.js";
import type { BroadcastRequest, CloseSession, OpenSession, ProgressReport, ResultReport, SubmitRequest, TraceContext } from "./wire.js";

/** The statuses a task ends in. */
export const TERMINAL: ReadonlySet<string> = new Set(["success", "failed", "dead", "cancelled"]);

/** Where and as whom to call (defaults: `$REACH_HUB_URL`, `$REACH_API_KEY`). */
export interface CallOptions {
  hub?: string;
  apiKey?: string;
  /** Abort the call (and any wait it is in). */
  signal?: AbortSignal;
}

export type Rules = Record<string, string | number | boolean>;

export interface SendOptions extends CallOptions {
  /** The capability invoked; may be left out with an `intent` (the match names it). */
  method?: string;
  payload?: Record<string, unknown>;
  /** A blob uploaded to the hub (`PUT /v1/blobs`) as the task's large payload: the agent
   * gets a short-lived signed link to it with the delivery (`delivery.body.payload_ref.url`). */
  payloadRef?: string;
  agentId?: string;
  tags?: readonly string[];
  capability?: string;
  /** What is needed, in words: the hub matches it to a declared capability by meaning. */
  intent?: string;
  rules?: Rules;
  /** Idempotency: resubmitting the same `taskId` returns the same task. */
  taskId?: string;
  /** The task's own deadline at the hub (default 30 s). */
  timeoutMs?: number;
  sessionId?: string;
  /** `"online"` (a user waits: consumed first) or `"background"`. */
  priority?: "online" | "background";
  /** The hub POSTs the result here once the task ends, signed. */
  callbackUrl?: string;
  callbackContext?: unknown;
  callbackProgress?: boolean;
  /** The trace a reach sent from inside a handler carries (none at the edge). */
  trace?: TraceContext;
  /** W3C trace context (OpenTelemetry), sent as the `traceparent` header: a handler
   * passes `delivery.traceparent`, a caller its current span's. */
  traceparent?: string;
}

export interface Submission {
  taskId: string;
  status: string;
  /** The agent and capability an intent was matched to (or what was named). */
  agentId?: string | null;
  method?: string | null;
}

/** The task as the hub shows it (`GET /v1/tasks/{id}`); more members may be present. */
export interface TaskView {
  task_id: string;
  status: string;
  attempt_seq: number;
  agent_id?: string | null;
  instance_id?: string | null;
  result?: unknown;
  error?: Record<string, unknown> | null;
  [member: string]: unknown;
}

export interface TaskResult {
  taskId: string;
  data: unknown;
  agentId: string | null;
  instanceId: string | null;
  attemptSeq: number;
  /** The whole task view. */
  task: TaskView;
}

const SUBMITTED = ["task_id", "status"] as const;
const VIEW = ["task_id", "status", "attempt_seq"] as const;
const BROADCAST = ["broadcast_id", "complete", "reason", "succeeded", "results"] as const;
const MAX_WAIT_S = 30; // one long-poll; the hub takes at most 60

function client(opts: CallOptions, timeoutMs = 10_000): HubClient {
  const o: { hub?: string; apiKey?: string; timeoutMs: number } = { timeoutMs };
  if (opts.hub !== undefined) o.hub = opts.hub;
  if (opts.apiKey !== undefined) o.apiKey = opts.apiKey;
  return new HubClient(o);
}

/** A method is a name, not a path: refused here, before it is sent, as the hub would. */
function checkMethod(method: string | null | undefined): void {
  if (typeof method !== "string") return;
  const why = nameRefusal(method);
  if (why !== null) throw new InvalidTaskRequest(why, { status: 422, extra: { field: "method" } });
}

function defined<T extends object>(body: T): T {
  return Object.fromEntries(Object.entries(body).filter(([, v]) => v !== undefined && v !== null)) as T;
}

/** Submit one task; idempotent on `taskId` (resubmitting returns the same task). */
export async function send(opts: SendOptions): Promise<Submission> {
  checkMethod(opts.method);
  const body: SubmitRequest = defined({
    method: opts.method,
    payload: opts.payload ?? {},
    payload_ref: opts.payloadRef,
    agent_id: opts.agentId,
    tags: [...(opts.tags ?? [])],
    capability: opts.capability,
    intent: opts.intent,
    rules: opts.rules ?? {},
    task_id: opts.taskId,
    timeout_ms: opts.timeoutMs ?? 30_000,
    session_id: opts.sessionId,
    trace: opts.trace,
    priority: opts.priority === "background" ? "background" : undefined,
    callback_url: opts.callbackUrl,
    callback_context: opts.callbackContext,
    callback_progress: opts.callbackProgress || undefined,
  });
  // the first intent a hub process matches may wait for its model to load (seconds)
  const timeoutMs = opts.intent !== undefined ? 60_000 : 10_000;
  const answer = await client(opts, timeoutMs).post<{
    task_id: string;
    status: string;
    agent_id?: string | null;
    method?: string | null;
  }>("/v1/tasks", body, {
    keys: SUBMITTED,
    ...signalOf(opts),
    ...(opts.traceparent ? { headers: { traceparent: opts.traceparent } } : {}),
  });
  return { taskId: answer.task_id, status: answer.status, agentId: answer.agent_id, method: answer.method };
}

function signalOf(opts: CallOptions): { signal?: AbortSignal } {
  return opts.signal ? { signal: opts.signal } : {};
}

export interface GetTaskOptions extends CallOptions {
  /** Long-poll up to this long for a change (ms, at most 60 000). */
  waitMs?: number;
}

/** The task's view; a task the key may not read raises `UnknownTask`, like a missing one. */
export async function getTask(taskId: string, opts: GetTaskOptions = {}): Promise<TaskView> {
  const wait = (opts.waitMs ?? 0) / 1000;
  return client(opts, wait * 1000 + 10_000).get<TaskView>(`/v1/tasks/${encodeURIComponent(taskId)}`, {
    query: wait ? { wait } : {},
    keys: VIEW,
    ...signalOf(opts),
  });
}

export interface WaitOptions extends CallOptions {
  /** How long to wait for a terminal state (default 60 s); `ResultTimeout` past it. */
  timeoutMs?: number;
}

/** Wait until the task is terminal; its data, or the typed error of how it ended. */
export async function waitForResult(taskId: string, opts: WaitOptions = {}): Promise<TaskResult> {
  const timeoutMs = opts.timeoutMs ?? 60_000;
  const deadline = Date.now() + timeoutMs;
  const hub = client(opts, (MAX_WAIT_S + 10) * 1000);
  const path = `/v1/tasks/${encodeURIComponent(taskId)}`;
  for (;;) {
    const left = deadline - Date.now();
    const wait = Math.round(Math.max(0, Math.min(left / 1000, MAX_WAIT_S)) * 1000) / 1000;
    const view = await hub.get<TaskView>(path, { query: { wait }, keys: VIEW, ...signalOf(opts) });
    if (TERMINAL.has(view.status)) return outcome(view);
    if (Date.now() >= deadline) throw timedOut(view, taskId, timeoutMs);
  }
}

function timedOut(view: TaskView, taskId: string, timeoutMs: number): ResultTimeout {
  const extra = { task_id: taskId, status: view.status };
  if (view.status === "awaiting_approval") {
    return new ResultTimeout(
      `task ${taskId} is still awaiting approval after ${timeoutMs / 1000}s ` +
        "(a human must approve or reject it: `reach approvals list`)",
      { extra },
    );
  }
  return new ResultTimeout(`task ${taskId} is still ${view.status} after ${timeoutMs / 1000}s`, { extra });
}

const str = (v: unknown): string | undefined => (v === undefined || v === null || v === "" ? undefined : String(v));

/** A terminal view's data, or the typed error it ended with (as `reach.sdk.caller._outcome`). */
export function outcome(view: TaskView): TaskResult {
  const { status, task_id: taskId } = view;
  const error = (view.error ?? {}) as Record<string, unknown>;
  if (status === "success") {
    return {
      taskId,
      data: view.result ?? null,
      agentId: view.agent_id ?? null,
      instanceId: view.instance_id ?? null,
      attemptSeq: view.attempt_seq,
      task: view,
    };
  }
  if (status === "failed" && error["kind"] === "approval_rejected") {
    const by = error["decided_by"];
    const reason = error["reason"];
    throw new ApprovalRejected(str(error["message"]) ?? `task ${taskId} was rejected by ${by}: ${reason}`, {
      extra: {
        task_id: taskId,
        approval_id: error["approval_id"],
        decided_by: by,
        decided_name: error["decided_name"],
        reason,
      },
    });
  }
  if (status === "failed" && error["kind"] === "approval_expired") {
    throw new ApprovalExpired(str(error["message"]) ?? `task ${taskId}: nobody approved it in time`, {
      extra: { task_id: taskId, approval_id: error["approval_id"], expires_at: error["expires_at"] },
    });
  }
  if (status === "failed") {
    const code = Number(error["code"] ?? 1);
    throw new BusinessError(Number.isInteger(code) && code !== 0 ? code : 1, str(error["message"]) ?? "", {
      extra: { task_id: taskId },
    });
  }
  if (status === "dead") {
    throw new DeadLettered(
      `task ${taskId} was dead-lettered: ${str(error["reason"]) ?? ""} (${error["kind"]}: ${error["message"]})`,
      { extra: { task_id: taskId, cause: error["kind"] } },
    );
  }
  if (status === "cancelled" && error["kind"] === "session_closed") {
    throw new SessionClosed(str(error["message"]) ?? `task ${taskId}: its session was closed`, {
      extra: { task_id: taskId, session_id: error["session_id"], reason: error["reason"] },
    });
  }
  throw new ReachError(`task ${taskId} ended as ${status}`, { extra: { task_id: taskId } });
}

export interface BroadcastOptions extends CallOptions {
  method: string;
  payload?: Record<string, unknown>;
  capability?: string;
  tags?: readonly string[];
  rules?: Rules;
  /** Complete as soon as this many targets succeeded (all, by default). */
  minResults?: number;
  /** How long to gather (default 30 s). */
  timeoutMs?: number;
}

/** One target's answer in a broadcast. */
export interface BroadcastAnswer {
  status: string;
  data?: unknown;
  agent_id?: string;
  instance_id?: string;
  [member: string]: unknown;
}

export interface BroadcastResult {
  broadcastId: string;
  complete: boolean;
  reason: string;
  succeeded: number;
  results: BroadcastAnswer[];
  /** The data of every target that succeeded so far. */
  readonly data: unknown[];
}

interface BroadcastView {
  broadcast_id: string;
  complete: boolean;
  reason: string;
  succeeded: number;
  results: BroadcastAnswer[];
}

/**
 * Send to every routable instance matching `capability`/`tags` and gather their results:
 * returns once `minResults` targets succeeded (all, by default), every target finished,
 * or `timeoutMs` passed; each target's status is in `results`.
 */
export async function broadcast(opts: BroadcastOptions): Promise<BroadcastResult> {
  checkMethod(opts.method);
  const timeoutMs = opts.timeoutMs ?? 30_000;
  const body: BroadcastRequest = defined({
    method: opts.method,
    payload: opts.payload ?? {},
    capability: opts.capability,
    tags: [...(opts.tags ?? [])],
    rules: opts.rules ?? {},
    min_results: opts.minResults,
    timeout_ms: Math.max(1, Math.floor(timeoutMs)),
  });
  const hub = client(opts, timeoutMs + 15_000);
  let view = await hub.post<BroadcastView>("/v1/broadcasts", body, { keys: BROADCAST, ...signalOf(opts) });
  const deadline = Date.now() + timeoutMs;
  while (!view.complete && Date.now() < deadline) {
    const wait = Math.round(Math.max(0, Math.min((deadline - Date.now()) / 1000, MAX_WAIT_S)) * 1000) / 1000;
    view = await hub.get<BroadcastView>(`/v1/broadcasts/${encodeURIComponent(view.broadcast_id)}`, {
      query: { wait },
      keys: BROADCAST,
      ...signalOf(opts),
    });
  }
  const results = view.results;
  return {
    broadcastId: view.broadcast_id,
    complete: view.complete,
    reason: view.reason,
    succeeded: view.succeeded,
    results,
    get data() {
      return results.filter((r) => r.status === "success").map((r) => r.data);
    },
  };
}

export interface ReportOptions extends CallOptions {
  /** The delivery's `attempt_seq` and the agent's own `instance_id` (both required by
   * the hub: a report for another attempt or instance raises `StaleReport`). */
  attemptSeq: number;
  instanceId: string;
}

/** Report the result of a task answered with 202; true if this report decided it. */
export async function reportResult(
  taskId: string,
  data: unknown,
  opts: ReportOptions & { code?: number; message?: string },
): Promise<boolean> {
  const body: ResultReport = defined({
    code: opts.code ?? 0,
    data,
    message: opts.message ?? "",
    attempt_seq: opts.attemptSeq,
    instance_id: opts.instanceId,
  });
  const answer = await client(opts).post<{ decided: boolean }>(`/v1/tasks/${encodeURIComponent(taskId)}/result`, body, {
    keys: ["decided"],
    ...signalOf(opts),
  });
  return Boolean(answer.decided);
}

/** Report progress (0..1) of an accepted task; named like a result (see `reportResult`). */
export async function reportProgress(
  taskId: string,
  progress: number | undefined,
  opts: ReportOptions & { message?: string; data?: unknown },
): Promise<void> {
  const body: ProgressReport = defined({
    progress,
    message: opts.message ?? "",
    data: opts.data,
    attempt_seq: opts.attemptSeq,
    instance_id: opts.instanceId,
  });
  await client(opts).post(`/v1/tasks/${encodeURIComponent(taskId)}/progress`, body, signalOf(opts));
}

/** A session's state as the hub shows it (`open`, `closed`, `expired`; more members). */
export interface SessionView {
  state: string;
  alive?: boolean;
  [member: string]: unknown;
}

const sessionPath = (id: string, action = "") => `/v1/sessions/${encodeURIComponent(id)}${action ? `/${action}` : ""}`;

/** Open `sessionId` (or renew an open one's TTL); a closed one raises `SessionClosed`. */
export async function openSession(sessionId: string, opts: CallOptions & { ttlS?: number } = {}): Promise<SessionView> {
  const body: OpenSession = opts.ttlS === undefined ? {} : { ttl_s: opts.ttlS };
  return client(opts).post<SessionView>(sessionPath(sessionId, "open"), body, { keys: ["state"], ...signalOf(opts) });
}

/** Close `sessionId`: its queued reaches are cancelled, new ones raise `SessionClosed`. */
export async function closeSession(sessionId: string, opts: CallOptions & { reason?: string } = {}): Promise<SessionView> {
  const body: CloseSession = opts.reason === undefined ? {} : { reason: opts.reason };
  return client(opts).post<SessionView>(sessionPath(sessionId, "close"), body, {
    keys: ["state", "cancelled"],
    ...signalOf(opts),
  });
}

/** The session's state; `UnknownSession` for one never opened nor closed. */
export async function getSession(sessionId: string, opts: CallOptions = {}): Promise<SessionView> {
  return client(opts).get<SessionView>(sessionPath(sessionId), { keys: ["state", "alive"], ...signalOf(opts) });
}
