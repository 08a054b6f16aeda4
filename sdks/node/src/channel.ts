/**
 * The agent's side of the channel: a WebSocket it opens to the hub (`/v1/agents/channel`)
 * for when the hub cannot open a connection to it (NAT, a home network, a locked-down
 * container platform), as `reach/sdk/channel.py`.
 *
 * `new Agent({..., channel: true})` (or an agent with no `addr`) serves through this
 * instead of an HTTP server. The socket registers (`hello` with the declaration, answered
 * `welcome`), answers the hub's `ping` frames with `pong`, sends `heartbeat` frames at the
 * agent's interval, and runs each `deliver` frame exactly as the HTTP server would (reach
 * token checked, dedup guard, concurrency bound) after an `ack`. The `result` goes back on
 * the socket that brought the delivery; if that socket died meanwhile the answer is
 * dropped: the hub retries the attempt and the dedup guard answers the retry.
 *
 * A lost socket is redialled after a jittered, doubling pause (0.2 s up to 10 s).
 */

import WebSocket from "ws";

import type { Agent } from "./agent.js";
import { Forbidden, InvalidRegistration, ReachError, Unauthenticated } from "./errors.js";

export const PATH = "/v1/agents/channel";
export const MAX_FRAME_BYTES = 2 * 1_048_576;
const BACKOFF_FIRST_S = 0.2;
const BACKOFF_MAX_S = 10;
const KEEPALIVE_S = 15;
const UNAUTHENTICATED = new Set(["missing", "malformed", "unknown_key", "wrong_secret", "expired", "revoked"]);
const FROM_HUB = new Set(["welcome", "deliver", "ping", "error"]);

export function channelUrl(hub: string): string {
  if (hub.startsWith("https://")) return "wss://" + hub.slice("https://".length) + PATH;
  if (hub.startsWith("http://")) return "ws://" + hub.slice("http://".length) + PATH;
  return hub + PATH;
}

/** The typed error of a hub's `error` frame that ends the channel. */
export function refusalError(code: string, message: string): ReachError {
  if (UNAUTHENTICATED.has(code)) return new Unauthenticated(message);
  if (code === "forbidden" || code === "wrong_agent") return new Forbidden(message);
  if (code === "invalid_registration" || code === "invalid-request" || code === "bad_frame") {
    return new InvalidRegistration(message);
  }
  return new ReachError(`${code}: ${message}`);
}

type Frame = Record<string, unknown> & { type: string };

/** One received frame, checked (as `reach.core.interop.channel.parse`); null for anything else. */
export function parseFrame(raw: string): Frame | null {
  if (raw.length > MAX_FRAME_BYTES) return null;
  let data: unknown;
  try {
    data = JSON.parse(raw);
  } catch {
    return null;
  }
  if (data === null || typeof data !== "object" || Array.isArray(data)) return null;
  const frame = data as Frame;
  if (typeof frame.type !== "string" || !FROM_HUB.has(frame.type)) return null;
  if (frame.type === "deliver") {
    const { task_id, attempt_seq, method, raw } = frame;
    if (typeof task_id !== "string" || !task_id || !Number.isInteger(attempt_seq) || (attempt_seq as number) < 0) {
      return null;
    }
    if (typeof method !== "string" || typeof raw !== "string") return null;
  }
  return frame;
}

/** The socket of one agent instance, redialled until `stop`. */
export class AgentChannel {
  readonly url: string;
  /** Sockets opened and welcomed (tests and logs). */
  connects = 0;
  private readonly headers: Record<string, string>;
  private ws: WebSocket | null = null;
  private stopping = false;
  private failures = 0;
  private redial: NodeJS.Timeout | null = null;

  constructor(
    readonly agent: Agent,
    hubUrl: string,
    apiKey: string | undefined,
  ) {
    this.url = channelUrl(hubUrl);
    this.headers = apiKey ? { Authorization: `Bearer ${apiKey}` } : {};
  }

  get connected(): boolean {
    return this.ws !== null && this.ws.readyState === WebSocket.OPEN && this.agent.registered;
  }

  /** Dial and register; rejects if the hub refuses this agent's key or declaration (a hub
   * that is down is redialled in the background after `waitMs`). */
  start(waitMs = 10_000): Promise<void> {
    this.stopping = false;
    return new Promise<void>((resolve, reject) => {
      let settled = false;
      const settle = (err?: ReachError): void => {
        if (settled) return;
        settled = true;
        clearTimeout(timer);
        if (err) {
          void this.stop();
          reject(err);
        } else resolve();
      };
      const timer = setTimeout(() => settle(), waitMs);
      this.dial(settle);
    });
  }

  async stop(): Promise<void> {
    this.stopping = true;
    if (this.redial !== null) clearTimeout(this.redial);
    this.redial = null;
    const ws = this.ws;
    this.ws = null;
    if (ws !== null && ws.readyState !== WebSocket.CLOSED) {
      await new Promise<void>((resolve) => {
        const force = setTimeout(() => {
          ws.terminate();
          resolve();
        }, 2000);
        ws.once("close", () => {
          clearTimeout(force);
          resolve();
        });
        ws.close(1000);
      });
    }
  }

  private dial(settle: (err?: ReachError) => void): void {
    if (this.stopping) return;
    const ws = new WebSocket(this.url, {
      headers: this.headers,
      maxPayload: MAX_FRAME_BYTES,
      perMessageDeflate: false,
      handshakeTimeout: this.agent.hub.timeoutMs,
    });
    this.ws = ws;
    let welcomed = false;
    let beat: NodeJS.Timeout | null = null;
    let keepalive: NodeJS.Timeout | null = null;
    let heard = Date.now();
    let silentAfterMs = 4 * KEEPALIVE_S * 1000;

    ws.on("open", () => {
      ws.send(JSON.stringify({ type: "hello", register: this.agent.declaration }));
    });
    ws.on("pong", () => (heard = Date.now()));
    ws.on("message", (raw: WebSocket.RawData) => {
      heard = Date.now();
      const frame = parseFrame(raw.toString());
      if (frame === null) {
        console.error("reach: hub sent a channel frame the SDK cannot read: closing");
        ws.close(1008, "bad frame");
        return;
      }
      if (!welcomed) {
        if (frame.type === "welcome") {
          welcomed = true;
          this.failures = 0;
          this.connects += 1;
          this.agent.markRegistered(true);
          const pingInterval = Number(frame["ping_interval"] ?? KEEPALIVE_S) || KEEPALIVE_S;
          silentAfterMs = Math.max(1000, 4 * pingInterval * 1000);
          const sendBeat = (): void => this.send(ws, { type: "heartbeat", heartbeat: this.agent.load() });
          sendBeat();
          beat = setInterval(sendBeat, this.agent.declaration.heartbeat_interval * 1000);
          keepalive = setInterval(() => {
            if (Date.now() - heard > silentAfterMs) {
              console.warn(`reach: channel of ${this.agent.agentId}: hub silent, redialling`);
              ws.terminate();
            } else if (ws.readyState === WebSocket.OPEN) ws.ping();
          }, KEEPALIVE_S * 1000);
          settle();
          return;
        }
        const code = frame.type === "error" ? String(frame["code"] ?? "closed") : "protocol";
        const message = frame.type === "error" ? String(frame["message"] ?? "") : `expected welcome, got ${frame.type}`;
        this.stopping = true;
        settle(refusalError(code, message));
        ws.close(1000);
        return;
      }
      this.handle(ws, frame);
    });
    ws.on("error", (err) => {
      console.warn(`reach: channel of ${this.agent.agentId} down: ${err.message}`);
    });
    ws.on("close", () => {
      if (beat !== null) clearInterval(beat);
      if (keepalive !== null) clearInterval(keepalive);
      if (this.ws === ws) this.ws = null;
      if (this.stopping) return;
      if (!welcomed && this.failures === 0) settle(); // the hub is down: start anyway, keep redialling
      this.failures += 1;
      const pause = Math.min(BACKOFF_MAX_S, BACKOFF_FIRST_S * 2 ** Math.min(this.failures, 10));
      const wait = (pause / 2 + Math.random() * (pause / 2)) * 1000;
      this.redial = setTimeout(() => this.dial(settle), wait);
    });
  }

  private handle(ws: WebSocket, frame: Frame): void {
    if (frame.type === "ping") {
      this.send(ws, { type: "pong", id: frame["id"] });
    } else if (frame.type === "deliver") {
      this.send(ws, { type: "ack", task_id: frame["task_id"], attempt_seq: frame["attempt_seq"] });
      void this.runDelivery(ws, frame);
    } else if (frame.type === "error") {
      console.warn(`reach: hub refused a frame of ${this.agent.agentId}: ${String(frame["code"])}: ${String(frame["message"] ?? "")}`);
    }
  }

  private async runDelivery(ws: WebSocket, frame: Frame): Promise<void> {
    const taskId = frame["task_id"] as string;
    const seq = frame["attempt_seq"] as number;
    const method = String(frame["method"]);
    // the body's bytes as the worker posted them (base64): the token binds their digest
    const raw = Buffer.from(String(frame["raw"]), "base64");
    let body: unknown;
    try {
      body = JSON.parse(raw.toString("utf8"));
    } catch {
      body = null;
    }
    const authorization = typeof frame["authorization"] === "string" ? frame["authorization"] : null;
    let status: number;
    let reply: Record<string, unknown>;
    try {
      if (body === null || typeof body !== "object" || Array.isArray(body)) {
        [status, reply] = [400, { code: 400, message: "delivery body is not a JSON object" }];
      } else {
        const fields = body as Record<string, unknown>;
        [status, reply] =
          (await this.agent.admit(fields, authorization, method, raw)) ?? (await this.agent.invoke(method, fields));
      }
    } catch (err) {
      console.error(`reach: delivery of ${taskId} failed in the SDK:`, err);
      [status, reply] = [500, { code: -1, message: `${(err as Error).name}: ${(err as Error).message}` }];
    }
    if (ws !== this.ws || ws.readyState !== WebSocket.OPEN) return; // the hub retries; dedup answers
    this.send(ws, { type: "result", task_id: taskId, attempt_seq: seq, status, body: reply });
  }

  private send(ws: WebSocket, frame: Record<string, unknown>): void {
    if (ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify(frame));
  }
}
