/**
 * The agent-side dedup guard: a redelivered task gets the stored answer, not a second run
 * (as `reach/sdk/dedup.py`).
 *
 * At-least-once delivery means an agent can see the same `task_id` twice (a retry after a
 * lost answer, a redelivery after a worker crash). `task_id` is the dedup key: it stays the
 * same across attempts; `attempt_seq` is only the hub's fencing token.
 *
 * The memory is bounded three ways (an agent runs for months): at most `capacity` answers,
 * at most `maxBytes` of them in total (measured as their JSON), and none older than `ttlMs`.
 * Least recently used answers go first. Answers live in memory: they die with the
 * process, so an agent killed after answering runs a redelivered task again.
 */

export const DEFAULT_CAPACITY = 10_000;
export const DEFAULT_MAX_BYTES = 64 * 1024 * 1024;
export const DEFAULT_TTL_MS = 24 * 3600 * 1000;

/** What an agent answers a delivery: HTTP status and JSON envelope. */
export type Answer = [status: number, body: Record<string, unknown>];

/** What to do with an arriving task: run it, answer from memory, or it is running now. */
export type Begin =
  | { action: "run" }
  | { action: "done"; answer: Answer }
  | { action: "running"; running: Promise<void> };

export interface GuardOptions {
  capacity?: number;
  maxBytes?: number;
  /** Milliseconds an answer is kept. */
  ttlMs?: number;
  /** Milliseconds, monotonic (tests pass their own). */
  timer?: () => number;
}

/** Bytes an answer weighs in the guard: its JSON, as the agent sends it. */
export function answerSize(answer: unknown): number {
  return Math.max(1, Buffer.byteLength(JSON.stringify(answer) ?? "null"));
}

interface Entry {
  answer: Answer;
  size: number;
  storedAt: number;
}

/** In-memory answers of the tasks this agent ran, bounded in count, bytes and age. */
export class IdempotencyGuard {
  readonly capacity: number;
  readonly maxBytes: number;
  readonly ttlMs: number;
  private readonly timer: () => number;
  // a Map iterates in insertion order: re-inserting on use makes it an LRU
  private readonly done = new Map<string, Entry>();
  private readonly running = new Map<string, { promise: Promise<void>; resolve: () => void }>();
  private held = 0;

  constructor(opts: GuardOptions = {}) {
    this.capacity = opts.capacity ?? DEFAULT_CAPACITY;
    this.maxBytes = opts.maxBytes ?? DEFAULT_MAX_BYTES;
    this.ttlMs = opts.ttlMs ?? DEFAULT_TTL_MS;
    this.timer = opts.timer ?? (() => performance.now());
    if (!(this.capacity >= 1 && this.maxBytes >= 1 && this.ttlMs > 0)) {
      throw new RangeError("dedup capacity, maxBytes and ttlMs must be positive");
    }
  }

  begin(taskId: string): Begin {
    const answer = this.lookup(taskId);
    if (answer !== undefined) return { action: "done", answer };
    const run = this.running.get(taskId);
    if (run !== undefined) return { action: "running", running: run.promise };
    let resolve!: () => void;
    const promise = new Promise<void>((r) => (resolve = r));
    this.running.set(taskId, { promise, resolve });
    return { action: "run" };
  }

  /** End a run; remember the answer only if it is final. A transient failure (`remember`
   * false) also drops an answer kept before -- the 202 of a handler that reported the
   * failure later -- so the hub's retry runs the task again. */
  finish(taskId: string, answer: Answer | null, remember: boolean): void {
    const run = this.running.get(taskId);
    this.running.delete(taskId);
    if (remember && answer !== null) this.remember(taskId, answer);
    else if (!remember) {
      const kept = this.done.get(taskId);
      if (kept !== undefined) this.drop(taskId, kept);
    }
    run?.resolve();
  }

  answerOf(taskId: string): Answer | undefined {
    return this.lookup(taskId);
  }

  get size(): number {
    this.expire();
    return this.done.size;
  }

  get bytesHeld(): number {
    this.expire();
    return this.held;
  }

  private lookup(taskId: string): Answer | undefined {
    const entry = this.done.get(taskId);
    if (entry === undefined) return undefined;
    if (this.timer() - entry.storedAt >= this.ttlMs) {
      this.drop(taskId, entry);
      return undefined;
    }
    this.done.delete(taskId); // a read refreshes its LRU place
    this.done.set(taskId, entry);
    return entry.answer;
  }

  private remember(taskId: string, answer: Answer): void {
    const size = answerSize(answer);
    if (size > this.maxBytes) return; // alone larger than the budget: a redelivery runs again
    const old = this.done.get(taskId);
    if (old !== undefined) this.drop(taskId, old);
    this.done.set(taskId, { answer, size, storedAt: this.timer() });
    this.held += size;
    this.expire();
    for (const [id, entry] of this.done) {
      if (this.done.size <= this.capacity && this.held <= this.maxBytes) break;
      this.drop(id, entry);
    }
  }

  private expire(): void {
    const now = this.timer();
    for (const [id, entry] of this.done) {
      if (now - entry.storedAt >= this.ttlMs) this.drop(id, entry);
    }
  }

  private drop(taskId: string, entry: Entry): void {
    this.done.delete(taskId);
    this.held -= entry.size;
  }
}
