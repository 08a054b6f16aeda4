/**
 * One error tree, mirroring the Python SDK's `reach/errors.py`: every class carries the
 * stable problem slug the hub puts in the `type` of its `application/problem+json`
 * answers (`urn:agent-reach:problem:<slug>`), and `errorForProblem` turns such an answer
 * back into the same class, so a caller catches by meaning (`instanceof NoSuitableAgent`).
 *
 * An unknown type is kept as it came (`type`, `status`, `detail`, every other member in
 * `extra`) on a plain `ReachError` (a `HubUnavailable` for a 5xx, as in Python).
 */

export const PROBLEM_TYPE_PREFIX = "urn:agent-reach:problem:";

/** A problem document (RFC 9457) as the hub sends it; extra members are kept. */
export interface Problem {
  type?: string;
  title?: string;
  status?: number;
  detail?: string;
  instance?: string;
  [member: string]: unknown;
}

export interface ReachErrorOptions {
  /** The problem `type` (defaults to the class's). */
  type?: string;
  /** The HTTP status (defaults to the class's). */
  status?: number;
  title?: string;
  /** Every other member of the problem document (`task_id`, `retry_after_ms`, ...). */
  extra?: Record<string, unknown>;
  /** Milliseconds to wait before trying again (from `Retry-After`, or the problem). */
  retryAfterMs?: number;
  cause?: unknown;
}

/** Base of every error Agent-Reach raises on purpose. */
export class ReachError extends Error {
  static readonly slug: string = "reach-error";
  static readonly defaultStatus: number = 500;
  static readonly title: string = "Agent-Reach error";

  /** The problem type, `urn:agent-reach:problem:<slug>` (or a foreign one, kept). */
  readonly type: string;
  readonly status: number;
  readonly title: string;
  /** The hub's explanation (also `message`). */
  readonly detail: string;
  /** The problem's other members, e.g. `task_id`, `depth`, `limit`, `cycle`. */
  readonly extra: Record<string, unknown>;
  /** When to try again, in ms, where the hub said so (`Retry-After`, `retry_after_ms`). */
  readonly retryAfterMs: number | undefined;

  constructor(detail: string, opts: ReachErrorOptions = {}) {
    super(detail, opts.cause === undefined ? undefined : { cause: opts.cause });
    const cls = new.target as typeof ReachError;
    this.name = cls.name;
    this.type = opts.type ?? PROBLEM_TYPE_PREFIX + cls.slug;
    this.status = opts.status ?? cls.defaultStatus;
    this.title = opts.title ?? cls.title;
    this.detail = detail;
    this.extra = opts.extra ?? {};
    this.retryAfterMs = opts.retryAfterMs ?? retryAfterFromExtra(this.extra);
  }

  /** The problem type of this class. */
  static problemType(): string {
    return PROBLEM_TYPE_PREFIX + this.slug;
  }

  /** The problem document this error stands for. */
  toProblem(): Problem {
    return { ...this.extra, type: this.type, title: this.title, status: this.status, detail: this.detail };
  }
}

function retryAfterFromExtra(extra: Record<string, unknown>): number | undefined {
  const ms = extra["retry_after_ms"];
  if (typeof ms === "number" && Number.isFinite(ms)) return ms;
  const s = extra["retry_after"];
  if (typeof s === "number" && Number.isFinite(s)) return s * 1000;
  return undefined;
}

/** A setting is missing or invalid; the message names the key. */
export class ConfigError extends ReachError {
  static override readonly slug: string = "config-error";
  static override readonly title: string = "Invalid configuration";
}

/** The registry refused a request. */
export class RegistryError extends ReachError {
  static override readonly slug: string = "registry-error";
  static override readonly defaultStatus: number = 400;
  static override readonly title: string = "Registry error";
}

/** A registration, heartbeat or capability declaration is malformed. */
export class InvalidRegistration extends RegistryError {
  static override readonly slug: string = "invalid-request";
  static override readonly defaultStatus: number = 422;
  static override readonly title: string = "Invalid request";
}

/** A loopback address was given without the explicit local-development opt-in. */
export class LoopbackAddress extends RegistryError {
  static override readonly slug: string = "loopback-address";
  static override readonly defaultStatus: number = 422;
  static override readonly title: string = "Loopback address refused";
}

/** The address resolves where the hub never calls (link-local, private outside the
 * declared networks, reserved), or does not resolve at all. */
export class AddressRefused extends RegistryError {
  static override readonly slug: string = "address-refused";
  static override readonly defaultStatus: number = 422;
  static override readonly title: string = "Address refused";
}

/** The agent or instance is already registered with different data. */
export class RegistrationConflict extends RegistryError {
  static override readonly slug: string = "registration-conflict";
  static override readonly defaultStatus: number = 409;
  static override readonly title: string = "Registration conflict";
}

/** A registration past a bound on what one agent or one key may hold. */
export class RegistryLimit extends RegistryError {
  static override readonly slug: string = "registry-limit";
  static override readonly defaultStatus: number = 409;
  static override readonly title: string = "Registry limit reached";
}

/** The instance named is not registered (or was deregistered). */
export class UnknownInstance extends RegistryError {
  static override readonly slug: string = "unknown-instance";
  static override readonly defaultStatus: number = 404;
  static override readonly title: string = "Unknown instance";
}

/** An A2A agent card is malformed, or declares nothing the hub can reach it by. */
export class InvalidAgentCard extends RegistryError {
  static override readonly slug: string = "invalid-agent-card";
  static override readonly defaultStatus: number = 422;
  static override readonly title: string = "Invalid agent card";
}

/** An A2A agent card could not be fetched (refused, timed out, not JSON, not 200). */
export class AgentCardUnavailable extends RegistryError {
  static override readonly slug: string = "agent-card-unavailable";
  static override readonly defaultStatus: number = 502;
  static override readonly title: string = "Agent card unavailable";
}

/** An MCP server lists no tool the hub can declare as a capability. */
export class InvalidMcpServer extends RegistryError {
  static override readonly slug: string = "invalid-mcp-server";
  static override readonly defaultStatus: number = 422;
  static override readonly title: string = "Invalid MCP server";
}

/** An MCP server did not answer initialize or tools/list (refused, timed out, not MCP). */
export class McpServerUnavailable extends RegistryError {
  static override readonly slug: string = "mcp-server-unavailable";
  static override readonly defaultStatus: number = 502;
  static override readonly title: string = "MCP server unavailable";
}

/** No agent with this ID is registered. */
export class UnknownAgent extends RegistryError {
  static override readonly slug: string = "unknown-agent";
  static override readonly defaultStatus: number = 404;
  static override readonly title: string = "Unknown agent";
}

/** No route could be chosen for a task. */
export class RoutingError extends ReachError {
  static override readonly slug: string = "routing-error";
  static override readonly defaultStatus: number = 422;
  static override readonly title: string = "Routing error";
}

/** No registered, routable instance matches the filter. */
export class NoSuitableAgent extends RoutingError {
  static override readonly slug: string = "no-suitable-agent";
  static override readonly defaultStatus: number = 404;
  static override readonly title: string = "No suitable agent";
}

/** An intent was given, but this hub has no embedding model (`extra.reason` says why). */
export class SemanticMatchingOff extends RoutingError {
  static override readonly slug: string = "semantic-matching-off";
  static override readonly defaultStatus: number = 501;
  static override readonly title: string = "Semantic matching is off";
}

/** Every matching instance's circuit breaker is open; `retryAfterMs` says when to retry. */
export class CircuitOpen extends RoutingError {
  static override readonly slug: string = "circuit-open";
  static override readonly defaultStatus: number = 503;
  static override readonly title: string = "Circuit open";
}

/** A task could not be delivered or completed. */
export class DeliveryError extends ReachError {
  static override readonly slug: string = "delivery-error";
  static override readonly defaultStatus: number = 502;
  static override readonly title: string = "Delivery error";
}

/** The agent refused the connection or could not be reached. */
export class AgentUnreachable extends DeliveryError {
  static override readonly slug: string = "agent-unreachable";
  static override readonly title: string = "Agent unreachable";
}

/** The agent did not answer in time. */
export class AgentTimeout extends DeliveryError {
  static override readonly slug: string = "agent-timeout";
  static override readonly defaultStatus: number = 504;
  static override readonly title: string = "Agent timeout";
}

/** The target is full (extra: depth, limit, retry_after_ms); never a failure nor retried. */
export class Backpressure extends DeliveryError {
  static override readonly slug: string = "backpressure";
  static override readonly defaultStatus: number = 429;
  static override readonly title: string = "Backpressure";

  /** How many tasks wait at the target, if the hub said. */
  get depth(): number | undefined {
    const v = this.extra["depth"];
    return typeof v === "number" ? v : undefined;
  }

  /** The target's limit, if the hub said. */
  get limit(): number | undefined {
    const v = this.extra["limit"];
    return typeof v === "number" ? v : undefined;
  }
}

/** The agent answered with a non-zero business code; never retried blindly. */
export class BusinessError extends DeliveryError {
  static override readonly slug: string = "business-error";
  static override readonly defaultStatus: number = 422;
  static override readonly title: string = "Business error";

  /** The agent's business code (non-zero). */
  readonly code: number;

  constructor(code: number, message = "", opts: ReachErrorOptions = {}) {
    super(message || `business error ${code}`, { ...opts, extra: { ...opts.extra, code } });
    this.code = code;
  }
}

/** Delivery exhausted its retries; an operator can replay it from the dead-letter queue. */
export class DeadLettered extends DeliveryError {
  static override readonly slug: string = "dead-lettered";
  static override readonly defaultStatus: number = 502;
  static override readonly title: string = "Dead-lettered";
}

/** A task request was refused. */
export class TaskError extends ReachError {
  static override readonly slug: string = "task-error";
  static override readonly defaultStatus: number = 400;
  static override readonly title: string = "Task error";
}

/** A task, broadcast, result or progress request fails validation (the field is named). */
export class InvalidTaskRequest extends TaskError {
  static override readonly slug: string = "invalid-task-request";
  static override readonly defaultStatus: number = 422;
  static override readonly title: string = "Invalid task request";
}

/** The payload does not satisfy the capability's params_schema. */
export class InvalidPayload extends TaskError {
  static override readonly slug: string = "invalid-payload";
  static override readonly defaultStatus: number = 422;
  static override readonly title: string = "Invalid payload";
}

/** No task with this ID exists (or none this key may read). */
export class UnknownTask extends TaskError {
  static override readonly slug: string = "unknown-task";
  static override readonly defaultStatus: number = 404;
  static override readonly title: string = "Unknown task";
}

/** A `callback_url` the hub will not POST to (invalid, or private): `rule` says why. */
export class CallbackRefused extends TaskError {
  static override readonly slug: string = "callback-refused";
  static override readonly defaultStatus: number = 422;
  static override readonly title: string = "Callback URL refused";
}

/** A stream's `Last-Event-ID` is garbage, negative, or newer than anything it sent. */
export class BadLastEventId extends TaskError {
  static override readonly slug: string = "bad-last-event-id";
  static override readonly defaultStatus: number = 400;
  static override readonly title: string = "Bad Last-Event-ID";
}

/** The task_id is already used by a task with different content. */
export class TaskConflict extends TaskError {
  static override readonly slug: string = "task-conflict";
  static override readonly defaultStatus: number = 409;
  static override readonly title: string = "Task conflict";
}

/** The task's current status does not allow this move in its lifecycle. */
export class IllegalTransition extends TaskConflict {
  static override readonly slug: string = "illegal-transition";
  static override readonly defaultStatus: number = 409;
  static override readonly title: string = "Illegal task transition";
}

/** A result or progress report names an attempt or instance the task is not waiting on. */
export class StaleReport extends TaskError {
  static override readonly slug: string = "stale-report";
  static override readonly defaultStatus: number = 409;
  static override readonly title: string = "Stale or foreign report";
}

/** The task reached no terminal state within the wait; it may still complete. */
export class ResultTimeout extends TaskError {
  static override readonly slug: string = "result-timeout";
  static override readonly defaultStatus: number = 408;
  static override readonly title: string = "Result timeout";
}

/** The hub, or the hub's database, could not be reached (refused, timeout, 5xx). */
export class HubUnavailable extends ReachError {
  static override readonly slug: string = "hub-unavailable";
  static override readonly defaultStatus: number = 503;
  static override readonly title: string = "Hub unavailable";
}

/** The hub refuses new work for a moment (memory admission); `retryAfterMs` says when. */
export class HubOverloaded extends HubUnavailable {
  static override readonly slug: string = "overloaded";
  static override readonly defaultStatus: number = 503;
  static override readonly title: string = "Hub overloaded";
}

/** The hub answered with a success status but not the JSON object the API promises. */
export class ProtocolError extends HubUnavailable {
  static override readonly slug: string = "protocol-error";
  static override readonly defaultStatus: number = 502;
  static override readonly title: string = "Protocol error";
}

/** A DAG definition or run is invalid. */
export class DagError extends ReachError {
  static override readonly slug: string = "dag-error";
  static override readonly defaultStatus: number = 422;
  static override readonly title: string = "DAG error";
}

/** Authentication or authorisation failed. */
export class SecurityError extends ReachError {
  static override readonly slug: string = "security-error";
  static override readonly defaultStatus: number = 403;
  static override readonly title: string = "Forbidden";
}

/** No valid credential: missing, malformed, unknown, expired or revoked. */
export class Unauthenticated extends SecurityError {
  static override readonly slug: string = "unauthenticated";
  static override readonly defaultStatus: number = 401;
  static override readonly title: string = "Unauthenticated";
}

/** A valid credential asked for something outside its scope, agent or allow-list. */
export class Forbidden extends SecurityError {
  static override readonly slug: string = "forbidden";
  static override readonly defaultStatus: number = 403;
  static override readonly title: string = "Forbidden";
}

/**
 * Too many failed authentications from this client address: no credential it sends is
 * checked until `retryAfterMs` (other addresses, and their keys, are not affected).
 */
export class TooManyAuthFailures extends SecurityError {
  static override readonly slug: string = "too-many-auth-failures";
  static override readonly defaultStatus: number = 429;
  static override readonly title: string = "Too many failed authentications";
}

/** A delivery's reach token is forged, expired, replayed or meant for someone else. */
export class InvalidReachToken extends SecurityError {
  static override readonly slug: string = "invalid-reach-token";
  static override readonly defaultStatus: number = 401;
  static override readonly title: string = "Invalid reach token";
}

/** A hub-signed webhook's signature is missing, malformed, forged or by an unknown key. */
export class InvalidSignature extends SecurityError {
  static override readonly slug: string = "invalid-signature";
  static override readonly defaultStatus: number = 401;
  static override readonly title: string = "Invalid signature";
}

/** No API key with this id exists (an operator listing or revoking keys). */
export class UnknownKey extends ReachError {
  static override readonly slug: string = "unknown-key";
  static override readonly defaultStatus: number = 404;
  static override readonly title: string = "Unknown API key";
}

/** A decision on an approval was refused, or the task it gated did not run. */
export class ApprovalError extends ReachError {
  static override readonly slug: string = "approval-error";
  static override readonly defaultStatus: number = 409;
  static override readonly title: string = "Approval error";
}

/** No approval with this id (or none this principal may see). */
export class UnknownApproval extends ApprovalError {
  static override readonly slug: string = "unknown-approval";
  static override readonly defaultStatus: number = 404;
  static override readonly title: string = "Unknown approval";
}

/** The approval was already decided; of two concurrent decisions exactly one wins. */
export class ApprovalDecided extends ApprovalError {
  static override readonly slug: string = "approval-decided";
  static override readonly defaultStatus: number = 409;
  static override readonly title: string = "Approval already decided";
}

/** Nobody decided in time (`waitForResult` raises it too, for `approval_expired`). */
export class ApprovalExpired extends ApprovalError {
  static override readonly slug: string = "approval-expired";
  static override readonly defaultStatus: number = 410;
  static override readonly title: string = "Approval expired";
}

/** A human rejected the task: `extra.decided_by` and `extra.reason` say who and why. */
export class ApprovalRejected extends ApprovalError {
  static override readonly slug: string = "approval-rejected";
  static override readonly defaultStatus: number = 403;
  static override readonly title: string = "Approval rejected";
}

/** `approval.forbid_self_approval`: the identity that submitted may not decide. */
export class SelfApproval extends ApprovalError {
  static override readonly slug: string = "self-approval";
  static override readonly defaultStatus: number = 403;
  static override readonly title: string = "Self-approval forbidden";
}

/** A rejection must say why. */
export class ReasonRequired extends ApprovalError {
  static override readonly slug: string = "reason-required";
  static override readonly defaultStatus: number = 422;
  static override readonly title: string = "Reason required";
}

/** The task's stored payload no longer hashes to what was put up for approval. */
export class PayloadChanged extends ApprovalError {
  static override readonly slug: string = "payload-changed";
  static override readonly defaultStatus: number = 409;
  static override readonly title: string = "Payload changed since the request";
}

/** A reach closes an agent cycle (A -> B -> A) or exceeds `router.max_hops`: `extra.cycle`. */
export class LoopDetected extends ReachError {
  static override readonly slug: string = "loop-detected";
  static override readonly defaultStatus: number = 508;
  static override readonly title: string = "Dependency loop detected";
}

/** The reach's session is closed or expired: refused or cancelled (extra: session_id). */
export class SessionClosed extends ReachError {
  static override readonly slug: string = "session-closed";
  static override readonly defaultStatus: number = 410;
  static override readonly title: string = "Session closed";
}

/** No session with this id (or one the key may not see). */
export class UnknownSession extends ReachError {
  static override readonly slug: string = "unknown-session";
  static override readonly defaultStatus: number = 404;
  static override readonly title: string = "Unknown session";
}

/** A payload blob cannot be stored, read or referenced as asked. */
export class BlobError extends ReachError {
  static override readonly slug: string = "blob-error";
  static override readonly defaultStatus: number = 400;
  static override readonly title: string = "Blob error";
}

/** No blob with this id (one of another caller's looks the same). */
export class UnknownBlob extends BlobError {
  static override readonly slug: string = "unknown-blob";
  static override readonly defaultStatus: number = 404;
  static override readonly title: string = "Unknown blob";
}

/** The blob is already the payload of another task (a blob goes with one task). */
export class BlobTaken extends BlobError {
  static override readonly slug: string = "blob-taken";
  static override readonly defaultStatus: number = 409;
  static override readonly title: string = "Blob taken";
}

/** A blob link whose signature does not verify, or whose time is up. */
export class InvalidBlobLink extends BlobError {
  static override readonly slug: string = "invalid-blob-link";
  static override readonly defaultStatus: number = 403;
  static override readonly title: string = "Invalid blob link";
}

/** The request body exceeds the configured limit. */
export class RequestTooLarge extends ReachError {
  static override readonly slug: string = "payload-too-large";
  static override readonly defaultStatus: number = 413;
  static override readonly title: string = "Payload too large";
}

/** The request line and headers exceed the server's size or count limit. */
export class HeadersTooLarge extends ReachError {
  static override readonly slug: string = "headers-too-large";
  static override readonly defaultStatus: number = 431;
  static override readonly title: string = "Request header fields too large";
}

/** The request body is not valid JSON or not of the expected shape. */
export class MalformedRequest extends ReachError {
  static override readonly slug: string = "malformed-request";
  static override readonly defaultStatus: number = 400;
  static override readonly title: string = "Malformed request";
}

/** A listing's filter, time range or limit is not valid (the parameter named). */
export class InvalidQuery extends ReachError {
  static override readonly slug: string = "invalid-query";
  static override readonly defaultStatus: number = 422;
  static override readonly title: string = "Invalid query";
}

/** A page cursor that is garbage, was tampered with, or belongs to another listing. */
export class BadCursor extends InvalidQuery {
  static override readonly slug: string = "bad-cursor";
  static override readonly defaultStatus: number = 400;
  static override readonly title: string = "Bad cursor";
}

/** Every class of the tree, base first (the order `reach/errors.py` declares them). */
export const ERROR_CLASSES: readonly (typeof ReachError)[] = [
  ReachError,
  ConfigError,
  RegistryError,
  InvalidRegistration,
  LoopbackAddress,
  AddressRefused,
  RegistrationConflict,
  RegistryLimit,
  UnknownInstance,
  InvalidAgentCard,
  AgentCardUnavailable,
  InvalidMcpServer,
  McpServerUnavailable,
  UnknownAgent,
  RoutingError,
  NoSuitableAgent,
  SemanticMatchingOff,
  CircuitOpen,
  DeliveryError,
  AgentUnreachable,
  AgentTimeout,
  Backpressure,
  BusinessError as unknown as typeof ReachError,
  DeadLettered,
  TaskError,
  InvalidTaskRequest,
  InvalidPayload,
  UnknownTask,
  CallbackRefused,
  BadLastEventId,
  TaskConflict,
  IllegalTransition,
  StaleReport,
  ResultTimeout,
  HubUnavailable,
  HubOverloaded,
  ProtocolError,
  DagError,
  SecurityError,
  Unauthenticated,
  Forbidden,
  InvalidReachToken,
  InvalidSignature,
  TooManyAuthFailures,
  UnknownKey,
  ApprovalError,
  UnknownApproval,
  ApprovalDecided,
  ApprovalExpired,
  ApprovalRejected,
  SelfApproval,
  ReasonRequired,
  PayloadChanged,
  LoopDetected,
  SessionClosed,
  UnknownSession,
  BlobError,
  UnknownBlob,
  BlobTaken,
  InvalidBlobLink,
  RequestTooLarge,
  HeadersTooLarge,
  MalformedRequest,
  InvalidQuery,
  BadCursor,
];

/** Problem type (`urn:agent-reach:problem:<slug>`) → class. */
export const ERROR_BY_TYPE: ReadonlyMap<string, typeof ReachError> = new Map(
  ERROR_CLASSES.map((cls) => [cls.problemType(), cls]),
);

/**
 * The typed error for a problem document (the SDK side of the edge).
 *
 * `status` is the HTTP status of the answer; `retryAfterMs` the answer's `Retry-After`
 * (used when the problem itself does not say). A 401/403 is a security error even when
 * a proxy, not the hub, said it.
 */
export function errorForProblem(
  problem: Problem | Record<string, unknown>,
  status: number,
  retryAfterMs?: number,
): ReachError {
  const p = problem as Problem;
  const type = typeof p.type === "string" ? p.type : "";
  const title = typeof p.title === "string" ? p.title : undefined;
  const detail = String(p.detail || p.title || `HTTP ${status}`);
  const extra: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(p)) {
    if (!["type", "title", "status", "detail"].includes(k)) extra[k] = v;
  }
  const fromExtra = retryAfterFromExtra(extra);
  const opts: ReachErrorOptions = { status, extra, retryAfterMs: fromExtra ?? retryAfterMs };
  if (title !== undefined) opts.title = title;
  const cls = ERROR_BY_TYPE.get(type);
  if (cls === (BusinessError as unknown)) {
    const raw = extra["code"];
    let code = Number(raw ?? 1);
    if (!Number.isInteger(code)) {
      extra["raw_code"] = raw;
      code = 1;
    }
    delete extra["code"];
    return new BusinessError(code, detail, opts);
  }
  const refusal = status === 401 || status === 403;
  if (cls !== undefined && (!refusal || isSecurity(cls) || cls.defaultStatus === status)) {
    return new cls(detail, opts);
  }
  if (type) opts.type = type;
  if (status === 401) return new Unauthenticated(detail, opts);
  if (status === 403) return new Forbidden(detail, opts);
  if (status >= 500) return new HubUnavailable(detail, opts);
  return new ReachError(detail, opts);
}

function isSecurity(cls: typeof ReachError): boolean {
  return cls === SecurityError || cls.prototype instanceof SecurityError;
}
