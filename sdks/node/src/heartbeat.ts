/**
 * The heartbeat loop of an `Agent`, run in a worker thread with its own event loop: a
 * handler that hogs the main thread (a synchronous loop) cannot stop the hub from hearing
 * that the process is alive. The load comes from the main thread through shared memory
 * (`Int32Array` slots below); what the hub answers goes back as messages.
 */

import { isMainThread, parentPort, workerData } from "node:worker_threads";

/** Slots of the shared load: in flight, consecutive failures, last duration (µs), registered. */
export const IN_FLIGHT = 0;
export const FAILURES = 1;
export const LAST_US = 2;
export const REGISTERED = 3;

export interface HeartbeatData {
  hub: string;
  apiKey: string;
  declaration: { agent_id: string; instance_id: string; max_concurrency: number };
  interval: number;
  timeoutMs: number;
  shared: SharedArrayBuffer;
}

/** What the loop talks through: the worker's `parentPort`, or a `MessagePort` in-thread. */
export interface Port {
  postMessage(message: unknown): void;
  on(event: "message", listener: (message: unknown) => void): unknown;
  close(): void;
}

/** The loop; `inThread`: run on the main thread (the fallback), not keeping it alive. */
export function runHeartbeat(data: HeartbeatData, port: Port, inThread = false): () => void {
  const { hub, apiKey, declaration, interval, timeoutMs } = data;
  const load = new Int32Array(data.shared);
  const headers: Record<string, string> = { "Content-Type": "application/json", Accept: "application/json" };
  if (apiKey) headers["Authorization"] = `Bearer ${apiKey}`;
  const post = (path: string, body: unknown): Promise<Response> =>
    fetch(hub + path, { method: "POST", headers, body: JSON.stringify(body), signal: AbortSignal.timeout(timeoutMs) });

  // Set by `stop`: a heartbeat still out when the agent closes may come back "unknown
  // instance" after the agent deregistered, and must not register it again.
  let stopped = false;

  async function register(): Promise<void> {
    if (stopped) return;
    const res = await post("/v1/agents/register", declaration);
    const text = await res.text();
    if (res.ok) {
      Atomics.store(load, REGISTERED, 1);
      port.postMessage({ registered: true });
    } else {
      port.postMessage({ error: `registration refused: HTTP ${res.status} ${text.slice(0, 300)}` });
    }
  }

  let busy = false;
  async function beat(): Promise<void> {
    if (busy) return; // the previous heartbeat is still out
    busy = true;
    try {
      if (!Atomics.load(load, REGISTERED)) return await register();
      const inFlight = Atomics.load(load, IN_FLIGHT);
      const lastUs = Atomics.load(load, LAST_US);
      const res = await post("/v1/agents/heartbeat", {
        agent_id: declaration.agent_id,
        instance_id: declaration.instance_id,
        current_load: inFlight / declaration.max_concurrency,
        in_flight: inFlight,
        max_concurrency: declaration.max_concurrency,
        last_task_duration_ms: lastUs < 0 ? null : lastUs / 1000,
        consecutive_failure_count: Atomics.load(load, FAILURES),
        sent_at: Date.now() / 1000,
      });
      const text = await res.text();
      if (res.status === 404 && text.includes("unknown-instance")) {
        port.postMessage({ warning: "hub forgot this instance; registering again" });
        return await register();
      }
      if (!res.ok) {
        port.postMessage({ error: `heartbeat refused: HTTP ${res.status} ${text.slice(0, 300)}` });
        return;
      }
      port.postMessage({ beat: true, closed: res.headers.get("X-Reach-Closed-Sessions") ?? "" });
    } catch (err) {
      port.postMessage({ warning: `heartbeat failed, hub unavailable: ${(err as Error)?.message ?? String(err)}` });
    } finally {
      busy = false;
    }
  }

  const timer = setInterval(() => void beat(), interval * 1000);
  if (inThread) timer.unref();
  const stop = (): void => {
    stopped = true;
    clearInterval(timer);
    port.close();
  };
  port.on("message", (m) => {
    if (m === "stop") stop();
  });
  return stop;
}

if (!isMainThread && parentPort !== null && (workerData as { reachHeartbeat?: boolean } | null)?.reachHeartbeat) {
  runHeartbeat(workerData as HeartbeatData, parentPort);
}
