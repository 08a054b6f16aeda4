/**
 * Long handlers (as `reach/sdk/running.py`): a delivery waits for its handler at most
 * `acceptAfterMs` (10 000, or half the time left before the delivery's deadline when that
 * is sooner); a handler still running then is answered `202 {"code": 0, "accepted": true}`
 * and goes on. While it runs the agent sends a keepalive every third of the delivery's
 * time budget, within 1 and 10 s (`POST /v1/tasks/{id}/progress {"keepalive": true}`,
 * which holds the hub's watchdog off); when it ends, its outcome is reported
 * (`POST /v1/tasks/{id}/result`): its value, its business error, or a transient failure
 * (`"transient": true`, retried by the hub as a 5xx would be). A report that finds the hub
 * unavailable is retried with backoff for five minutes; one refused as stale is logged.
 *
 * A handler's value must be JSON: a BigInt, a Symbol, a function, a Map or Set, a
 * promise inside it, a non-finite number or a cycle fails the attempt with a 500 naming
 * the method and the type (a transient failure), never a success holding `{}` or `null`.
 */

import type { Answer } from "./dedup.js";

export const DEFAULT_ACCEPT_AFTER_MS = 10_000;
/** A delivery's time budget when it names no deadline: the hub's default task timeout. */
export const DEFAULT_BUDGET_MS = 30_000;
export const KEEPALIVE_MIN_MS = 1_000;
export const KEEPALIVE_MAX_MS = 10_000;
/** How long a report is retried while the hub is unavailable (a restart, an outage). */
export const REPORT_PATIENCE_MS = 300_000;
export const REPORT_BACKOFF_FIRST_MS = 500;
export const REPORT_BACKOFF_MAX_MS = 10_000;
/** The hub refuses a longer report message. */
export const MAX_REPORT_MESSAGE = 10_000;

/** Milliseconds a delivery waits for its handler before it is answered 202 (null: until it
 * ends); `deadlineMs` and `nowMs` are epoch milliseconds. */
export function acceptWaitMs(acceptAfterMs: number | null, deadlineMs: number | undefined, nowMs: number): number | null {
  if (acceptAfterMs === null) return null;
  if (deadlineMs === undefined) return acceptAfterMs;
  return Math.max(0, Math.min(acceptAfterMs, (deadlineMs - nowMs) / 2));
}

/** Milliseconds between keepalives of a run answered 202: a third of its budget, 1 to 10 s. */
export function keepaliveIntervalMs(budgetMs: number): number {
  return Math.max(KEEPALIVE_MIN_MS, Math.min(KEEPALIVE_MAX_MS, budgetMs / 3));
}

/** The 202 a delivery gets while its handler goes on. */
export function accepted(message = ""): Answer {
  return [202, message ? { code: 0, accepted: true, message } : { code: 0, accepted: true }];
}

/** What in `value` is not JSON as the hub reads it, and where (`at`: "" for the value
 * itself, else a path such as ".rows[2]"); null if it is all JSON. */
export function notJson(value: unknown, at = "", seen: Set<object> = new Set()): { what: string; at: string } | null {
  switch (typeof value) {
    case "string":
    case "boolean":
    case "undefined": // dropped from objects, null in arrays and at the top, as JSON.stringify does
      return null;
    case "number":
      return Number.isFinite(value) ? null : { what: `a non-finite number (${value})`, at };
    case "bigint":
    case "symbol":
    case "function":
      return { what: `a ${typeof value}`, at };
  }
  if (value === null) return null;
  const obj = value as Record<string, unknown>;
  if (seen.has(obj)) return { what: "a cycle", at };
  if (typeof obj["then"] === "function") return { what: "a promise (did you mean await?)", at };
  if (obj instanceof Map || obj instanceof Set || obj instanceof WeakMap || obj instanceof WeakSet) {
    return { what: `a ${obj.constructor.name}`, at };
  }
  if (typeof obj["toJSON"] === "function") return null; // a Date, or a class that says how
  seen.add(obj);
  const entries: [string, unknown][] = Array.isArray(obj)
    ? obj.map((item, i) => [`${at}[${i}]`, item])
    : Object.entries(obj).map(([k, item]) => [`${at}.${k}`, item]);
  for (const [path, item] of entries) {
    const found = notJson(item, path, seen);
    if (found !== null) return found;
  }
  seen.delete(obj);
  return null;
}

/** The 500 of a handler whose value is not JSON (`found`: what `notJson` said). */
export function notJsonAnswer(method: string, found: { what: string; at: string }): Answer {
  const what = found.at ? `a value holding ${found.what} at ${found.at}` : found.what;
  return [500, { code: -1, message: `handler for '${method}' returned ${what}, which is not JSON` }];
}

/** The fields of the report of a run that ended after its 202 (null: none, the handler
 * returned ACCEPTED and reports for itself). */
export function reportOf(answer: Answer, failed: boolean): Record<string, unknown> | null {
  const [status, body] = answer;
  if (status === 202) return null;
  const message = String(body["message"] ?? "").slice(0, MAX_REPORT_MESSAGE);
  if (failed) return { code: -1, message, transient: true };
  const code = body["code"];
  if (typeof code === "number" && code !== 0) return { code, message };
  return { code: 0, data: body["data"] ?? null };
}
