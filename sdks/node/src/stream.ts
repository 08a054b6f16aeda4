/**
 * Following a task as it happens: `for await (const event of stream(taskId))` (the Node
 * twin of `reach/sdk/stream.py`).
 *
 * The hub sends server-sent events (`GET /v1/tasks/{id}/stream`): the task's `state`
 * first, then `status` changes, `progress` reports and the `result`, each with an id. A
 * dropped connection is reopened with `Last-Event-ID`, so the iterator yields every event
 * once and in order, and ends after the final one. `streamPath` follows a broadcast
 * (`/v1/broadcasts/{id}/stream`: `answer` events, then `complete`) or a DAG run the same way.
 */

import { HubUnavailable, ProtocolError, ReachError, ResultTimeout, errorForProblem, type Problem } from "./errors.js";
import { HubClient, anySignal, parseRetryAfter } from "./http.js";

/** Kinds after which the hub closes the stream. */
export const FINAL_KINDS: ReadonlySet<string> = new Set(["result", "complete", "run"]);
const TERMINAL = new Set(["success", "failed", "dead", "cancelled"]);
/** Without a timeout: drops in a row (no event between) before giving up. */
export const MAX_FAILURES = 8;
/** The hub pings every 15 s by default: silence this long is a drop. */
export const IDLE_TIMEOUT_MS = 60_000;

/** One event: `kind` (state, status, progress, result; answer, complete; node, run),
 * its JSON `data` and its `id` (resume after it). */
export class StreamEvent {
  constructor(
    readonly kind: string,
    readonly data: unknown,
    readonly id: number | null,
  ) {}

  /** Whether the stream ends with this event (the hub closes it). */
  get final(): boolean {
    if (FINAL_KINDS.has(this.kind)) return true;
    if (this.kind === "state" && this.data !== null && typeof this.data === "object") {
      const d = this.data as Record<string, unknown>;
      return TERMINAL.has(String(d["status"])) || d["complete"] === true;
    }
    return false;
  }
}

/** A raw SSE event: its `event` name (`message` by default), joined `data` and `id`. */
export interface SseEvent {
  event: string;
  data: string;
  id: string | null;
}

/**
 * An incremental SSE parser: `feed` it chunks, it returns the events they complete
 * (comments, pings and `retry:` are skipped; a trailing event without its blank line is
 * kept until it gets one). The last `id:` seen stays in force for later events.
 */
export class SseParser {
  #buffer = "";
  #event = "";
  #data: string[] = [];
  #id: string | null = null;
  #decoder = new TextDecoder("utf-8");

  feed(chunk: Uint8Array | string): SseEvent[] {
    this.#buffer += typeof chunk === "string" ? chunk : this.#decoder.decode(chunk, { stream: true });
    const out: SseEvent[] = [];
    for (;;) {
      const r = this.#buffer.indexOf("\r");
      const n = this.#buffer.indexOf("\n");
      const cut = r < 0 ? n : n < 0 ? r : Math.min(r, n);
      if (cut < 0) break;
      if (this.#buffer[cut] === "\r" && cut + 1 === this.#buffer.length) break; // its \n may follow
      const line = this.#buffer.slice(0, cut);
      const step = this.#buffer.startsWith("\r\n", cut) ? 2 : 1;
      this.#buffer = this.#buffer.slice(cut + step);
      if (line === "") {
        if (this.#data.length || this.#event) {
          out.push({ event: this.#event || "message", data: this.#data.join("\n"), id: this.#id });
        }
        this.#event = "";
        this.#data = [];
        continue;
      }
      if (line.startsWith(":")) continue;
      const colon = line.indexOf(":");
      const name = colon < 0 ? line : line.slice(0, colon);
      let value = colon < 0 ? "" : line.slice(colon + 1);
      if (value.startsWith(" ")) value = value.slice(1);
      if (name === "event") this.#event = value;
      else if (name === "data") this.#data.push(value);
      else if (name === "id" && !value.includes("\0")) this.#id = value;
    }
    return out;
  }
}

/** Every event of an SSE byte stream (see `SseParser`). */
export async function* parseSse(chunks: AsyncIterable<Uint8Array | string> | Iterable<Uint8Array | string>): AsyncGenerator<SseEvent> {
  const parser = new SseParser();
  for await (const chunk of chunks) yield* parser.feed(chunk);
}

export interface StreamOptions {
  hub?: string;
  apiKey?: string;
  /** Bounds the whole wait: `ResultTimeout` past it (default: none). */
  timeoutMs?: number;
  /** Resume after this event id. */
  lastEventId?: number;
  /** Stop following (the iterator then throws the signal's reason). */
  signal?: AbortSignal;
}

/** The task's events until its result; a task the key may not read raises `UnknownTask`. */
export function stream(taskId: string, opts: StreamOptions = {}): AsyncGenerator<StreamEvent> {
  return streamPath(`/v1/tasks/${encodeURIComponent(taskId)}/stream`, opts);
}

const sleep = (ms: number, signal?: AbortSignal) =>
  new Promise<void>((resolve) => {
    const t = setTimeout(resolve, ms);
    signal?.addEventListener("abort", () => (clearTimeout(t), resolve()), { once: true });
  });

class Dropped extends Error {}

/** Follow any of the hub's streams (see the module comment), resuming on drops. */
export async function* streamPath(path: string, opts: StreamOptions = {}): AsyncGenerator<StreamEvent> {
  const init: { hub?: string; apiKey?: string } = {};
  if (opts.hub !== undefined) init.hub = opts.hub;
  if (opts.apiKey !== undefined) init.apiKey = opts.apiKey;
  const hub = new HubClient(init);
  const deadline = opts.timeoutMs === undefined ? undefined : Date.now() + opts.timeoutMs;
  const expired = () => deadline !== undefined && Date.now() >= deadline;
  const timeout = () => new ResultTimeout(`no final event from ${path} within ${opts.timeoutMs} ms`);
  let last = opts.lastEventId;
  let pause = 200;
  let failures = 0;
  for (;;) {
    opts.signal?.throwIfAborted();
    const ctl = new AbortController();
    const signal = opts.signal ? anySignal([opts.signal, ctl.signal]) : ctl.signal;
    let idle: NodeJS.Timeout | undefined;
    const arm = () => {
      clearTimeout(idle);
      let ms = IDLE_TIMEOUT_MS;
      if (deadline !== undefined) ms = Math.max(100, Math.min(ms, deadline - Date.now()));
      idle = setTimeout(() => ctl.abort(new Dropped("idle")), ms);
    };
    const headers: Record<string, string> = { Accept: "text/event-stream", ...hub.authHeaders() };
    if (last !== undefined) headers["Last-Event-ID"] = String(last);
    try {
      arm();
      let resp: Response;
      try {
        resp = await fetch(hub.url(path), { headers, signal });
      } catch (exc) {
        throw opts.signal?.aborted ? opts.signal.reason : new Dropped(hub.redact(String(exc)));
      }
      if (resp.status >= 400) {
        const text = await resp.text().catch(() => "");
        let problem: Problem = {};
        try {
          const parsed: unknown = JSON.parse(text);
          if (parsed && typeof parsed === "object" && !Array.isArray(parsed)) problem = parsed as Problem;
        } catch {
          problem = { detail: text.slice(0, 500) || `HTTP ${resp.status}` };
        }
        throw errorForProblem(problem, resp.status, parseRetryAfter(resp.headers.get("retry-after")));
      }
      if (!resp.body) throw new Dropped("no body");
      const parser = new SseParser();
      try {
        for await (const chunk of resp.body as AsyncIterable<Uint8Array>) {
          arm();
          for (const raw of parser.feed(chunk)) {
            const event = new StreamEvent(raw.event, json(raw.data), int(raw.id));
            if (event.id !== null) last = event.id;
            pause = 200;
            failures = 0;
            yield event;
            if (event.final) return;
          }
        }
      } catch (exc) {
        if (exc instanceof ReachError) throw exc;
        if (opts.signal?.aborted) throw opts.signal.reason;
        throw new Dropped(hub.redact(String(exc)));
      }
      // closed before the final event: resume after the last id
    } catch (exc) {
      if (!(exc instanceof Dropped)) throw exc;
      failures += 1;
      if (expired()) throw timeout();
      if (deadline === undefined && failures >= MAX_FAILURES) {
        throw new HubUnavailable(`hub at ${hub.baseUrl} is unreachable: ${exc.message}`);
      }
    } finally {
      clearTimeout(idle);
      ctl.abort();
    }
    if (expired()) throw timeout();
    await sleep(pause, opts.signal);
    pause = Math.min(pause * 2, 5_000);
  }
}

function json(data: string): unknown {
  try {
    return JSON.parse(data);
  } catch {
    throw new ProtocolError(`a stream event's data is not JSON: ${JSON.stringify(data.slice(0, 200))}`);
  }
}

function int(value: string | null): number | null {
  return value !== null && /^\d+$/.test(value) ? Number(value) : null;
}
