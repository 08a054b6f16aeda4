/**
 * The HTTP client for the hub, shared by callers and agents (the Node twin of
 * `reach/sdk/hub_client.py`).
 *
 * The edge where foreign exceptions stop: a refused connection or a timeout becomes
 * `HubUnavailable`, a problem document becomes the typed `ReachError` the hub raised
 * (see `errors.ts`), and a success status without the JSON object the API promises (a
 * proxy's HTML page, a wrong URL, a truncated answer) is a `ProtocolError`.
 *
 * Nothing is retried here, as in Python: a `Backpressure` or `CircuitOpen` carries
 * `retryAfterMs` and the caller decides whether to wait that long; resubmitting a task
 * with the same `task_id` is safe (the hub answers with the same task).
 *
 * Credentials go per request (`Authorization: Bearer <key>`); the key is kept out of
 * error messages (a detail that echoes it is scrubbed) and out of `inspect()`.
 */

import { ConfigError, HubUnavailable, ProtocolError, errorForProblem, type Problem } from "./errors.js";

export const DEFAULT_HUB_URL = "http://127.0.0.1:8800";
export const API_KEY_ENV = "REACH_API_KEY";
export const HUB_URL_ENV = "REACH_HUB_URL";
export const DEFAULT_TIMEOUT_MS = 10_000;

/** `$REACH_HUB_URL`, else `http://127.0.0.1:8800` (without a trailing slash). */
export function defaultHubUrl(): string {
  return (process.env[HUB_URL_ENV] || DEFAULT_HUB_URL).replace(/\/+$/, "");
}

/**
 * The key a client sends: `apiKey`, or `$REACH_API_KEY` when it is undefined; `""` means
 * none at all. Surrounding whitespace is dropped; a key with whitespace or control
 * characters inside is refused without echoing it.
 */
export function resolveApiKey(apiKey?: string | null): string | undefined {
  const raw = apiKey === undefined || apiKey === null ? process.env[API_KEY_ENV] : apiKey;
  const key = (raw ?? "").trim();
  if (!key) return undefined;
  if (!/^[\x21-\x7e]+$/.test(key)) {
    throw new ConfigError(
      `apiKey (or $${API_KEY_ENV}) is not a valid API key: it holds whitespace, control or ` +
        "non-ASCII characters (expected rk_<id>_<secret>)",
    );
  }
  return key;
}

/** The headers that carry a resolved key (none without one). */
export function authHeaders(apiKey: string | undefined): Record<string, string> {
  return apiKey ? { Authorization: `Bearer ${apiKey}` } : {};
}

/** `text` with the key replaced by its public part (`rk_<id>_…`). */
export function redact(text: string, apiKey: string | undefined): string {
  if (!apiKey || !text.includes(apiKey)) return text;
  const rest = apiKey.startsWith("rk_") ? apiKey.slice(3) : "";
  const cut = rest.indexOf("_");
  const shown = cut > 0 && cut < rest.length - 1 ? `rk_${rest.slice(0, cut)}_…` : "<api key>";
  return text.split(apiKey).join(shown);
}

/** A value with the key taken out of every string in it. */
export function scrub<T>(value: T, apiKey: string | undefined): T {
  if (!apiKey) return value;
  if (typeof value === "string") return redact(value, apiKey) as T;
  if (Array.isArray(value)) return value.map((v) => scrub(v, apiKey)) as T;
  if (value !== null && typeof value === "object") {
    const out: Record<string, unknown> = {};
    for (const [k, v] of Object.entries(value)) out[k] = scrub(v, apiKey);
    return out as T;
  }
  return value;
}

/** `Retry-After` (seconds or an HTTP date) in milliseconds, or undefined. */
export function parseRetryAfter(value: string | null | undefined, now: number = Date.now()): number | undefined {
  if (value === null || value === undefined || value.trim() === "") return undefined;
  const v = value.trim();
  if (/^\d+(\.\d+)?$/.test(v)) return Math.round(Number(v) * 1000);
  const at = Date.parse(v);
  return Number.isNaN(at) ? undefined : Math.max(0, at - now);
}

export interface HubClientOptions {
  /** The hub's base URL; default `$REACH_HUB_URL`, else `http://127.0.0.1:8800`. */
  hub?: string;
  /** Sent as `Authorization: Bearer <key>`; undefined takes `$REACH_API_KEY`, `""` none. */
  apiKey?: string;
  /** Default time for one request, in ms (10 s). */
  timeoutMs?: number;
}

export type Query = Record<string, string | number | boolean | undefined | null>;

export interface RequestOptions {
  /** Query parameters (undefined/null ones are left out). */
  query?: Query;
  /** This request's time limit in ms (else the client's). */
  timeoutMs?: number;
  /** Abort the request from outside. */
  signal?: AbortSignal;
  /** Extra headers. */
  headers?: Record<string, string>;
  /** Members the JSON answer must hold (else `ProtocolError`). */
  keys?: readonly string[];
}

/** A success answer: its JSON body, status and headers. */
export interface HubResponse<T> {
  body: T;
  status: number;
  headers: Headers;
}

/** Calls to one hub (see the module comment). */
export class HubClient {
  readonly baseUrl: string;
  readonly timeoutMs: number;
  readonly #apiKey: string | undefined;

  constructor(opts: HubClientOptions = {}) {
    this.baseUrl = (opts.hub || defaultHubUrl()).replace(/\/+$/, "");
    this.timeoutMs = opts.timeoutMs ?? DEFAULT_TIMEOUT_MS;
    this.#apiKey = resolveApiKey(opts.apiKey);
  }

  /** Whether this client sends an API key. */
  get authenticated(): boolean {
    return this.#apiKey !== undefined;
  }

  /** The headers that authenticate a request of this client (for streams). */
  authHeaders(): Record<string, string> {
    return authHeaders(this.#apiKey);
  }

  /** `text` without this client's key in it. */
  redact(text: string): string {
    return redact(text, this.#apiKey);
  }

  toString(): string {
    return `HubClient(${this.baseUrl}, apiKey=${this.#apiKey ? "set" : "none"})`;
  }

  [Symbol.for("nodejs.util.inspect.custom")](): string {
    return this.toString();
  }

  /** The full URL of `path` with `query`. */
  url(path: string, query?: Query): string {
    const url = new URL(this.baseUrl + path);
    for (const [k, v] of Object.entries(query ?? {})) {
      if (v !== undefined && v !== null) url.searchParams.set(k, String(v));
    }
    return url.toString();
  }

  /** `method path` with a JSON `body`; the answer's JSON (a typed error for a problem). */
  async request<T = Record<string, unknown>>(
    method: string,
    path: string,
    body?: unknown,
    opts: RequestOptions = {},
  ): Promise<T> {
    return (await this.exchange<T>(method, path, body, opts)).body;
  }

  /** As `request`, with the answer's status and headers. */
  async exchange<T = Record<string, unknown>>(
    method: string,
    path: string,
    body?: unknown,
    opts: RequestOptions = {},
  ): Promise<HubResponse<T>> {
    const what = `${method} ${this.baseUrl}${path}`;
    const timeoutMs = opts.timeoutMs ?? this.timeoutMs;
    const timer = AbortSignal.timeout(Math.max(1, Math.ceil(timeoutMs)));
    const signal = opts.signal ? anySignal([opts.signal, timer]) : timer;
    const headers: Record<string, string> = {
      Accept: "application/json, application/problem+json",
      ...opts.headers,
      ...this.authHeaders(),
    };
    const init: RequestInit = { method, headers, signal };
    if (body !== undefined) {
      headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    let resp: Response;
    let text: string;
    try {
      resp = await fetch(this.url(path, opts.query), init);
      text = await resp.text();
    } catch (exc) {
      if (opts.signal?.aborted) throw opts.signal.reason ?? exc;
      const timedOut = timer.aborted;
      const reason = timedOut ? `no answer within ${timeoutMs} ms` : this.redact(describe(exc));
      const how = timedOut ? "did not answer in time" : "is unreachable";
      throw new HubUnavailable(`hub at ${this.baseUrl} ${how}: ${reason}`, {
        extra: { timed_out: timedOut },
      });
    }
    if (resp.status >= 400) {
      const problem = scrub(problemOf(text, resp.status), this.#apiKey);
      throw errorForProblem(problem, resp.status, parseRetryAfter(resp.headers.get("retry-after")));
    }
    return { body: expected<T>(resp, text, opts.keys ?? [], what), status: resp.status, headers: resp.headers };
  }

  get<T = Record<string, unknown>>(path: string, opts: RequestOptions = {}): Promise<T> {
    return this.request<T>("GET", path, undefined, opts);
  }

  post<T = Record<string, unknown>>(path: string, body: unknown, opts: RequestOptions = {}): Promise<T> {
    return this.request<T>("POST", path, body, opts);
  }

  put<T = Record<string, unknown>>(path: string, body: unknown, opts: RequestOptions = {}): Promise<T> {
    return this.request<T>("PUT", path, body, opts);
  }

  delete<T = Record<string, unknown>>(path: string, body?: unknown, opts: RequestOptions = {}): Promise<T> {
    return this.request<T>("DELETE", path, body, opts);
  }
}

function describe(exc: unknown): string {
  if (exc instanceof Error) {
    const cause = (exc as Error & { cause?: unknown }).cause;
    const inner = cause instanceof Error ? `${cause.message}` : cause ? String(cause) : "";
    return inner && inner !== exc.message ? `${exc.message} (${inner})` : exc.message;
  }
  return String(exc);
}

function problemOf(text: string, status: number): Problem {
  try {
    const data: unknown = JSON.parse(text);
    if (data !== null && typeof data === "object" && !Array.isArray(data)) return data as Problem;
    return { value: data };
  } catch {
    return { detail: text.slice(0, 500) || `HTTP ${status}` };
  }
}

function expected<T>(resp: Response, text: string, keys: readonly string[], what: string): T {
  const kind = resp.headers.get("content-type") || "no content type";
  if (resp.status === 204 || (text === "" && keys.length === 0)) return {} as T;
  let data: unknown;
  try {
    data = JSON.parse(text);
  } catch {
    throw new ProtocolError(
      `${what} answered ${resp.status} (${kind}) with a body that is not JSON: ${JSON.stringify(text.slice(0, 200))}`,
      { extra: { http_status: resp.status } },
    );
  }
  if (data === null || typeof data !== "object" || Array.isArray(data)) {
    throw new ProtocolError(`${what} answered ${resp.status} with JSON ${Array.isArray(data) ? "array" : typeof data}, not an object`, {
      extra: { http_status: resp.status },
    });
  }
  const missing = keys.filter((k) => !(k in (data as object)));
  if (missing.length) {
    throw new ProtocolError(`${what} answered ${resp.status} without ${missing.join(", ")}`, {
      extra: { http_status: resp.status, missing },
    });
  }
  return data as T;
}

/** A signal aborted when any of `signals` is (`AbortSignal.any` where Node has it). */
export function anySignal(signals: AbortSignal[]): AbortSignal {
  const any = (AbortSignal as unknown as { any?: (s: AbortSignal[]) => AbortSignal }).any;
  if (any) return any(signals);
  const ctl = new AbortController();
  for (const s of signals) {
    if (s.aborted) {
      ctl.abort(s.reason);
      break;
    }
    s.addEventListener("abort", () => ctl.abort(s.reason), { once: true });
  }
  return ctl.signal;
}
