/**
 * An agent's check of the reach token on every delivery, before its handler runs (as
 * `reach/sdk/tokens.py`).
 *
 * The hub signs a token into each delivery: an EdDSA (Ed25519) JWT whose header names the
 * key (`kid`) and whose claims are `iss`, `sub`, `aud` (this agent), `task_id`,
 * `attempt_seq`, `method` (the one posted to), `body_sha256` (hex sha256 of the exact
 * body bytes: a captured token cannot carry another payload), `iat`, `exp` and `jti`. `TokenVerifier` checks the signature against the
 * hub's published keys (`GET /.well-known/jwks.json`, EdDSA only: never `none`, never an
 * HS* secret), then the claims, then that its `jti` was never seen. A refusal is what the
 * agent answers instead of running the handler:
 *
 * - 401: the token is missing, forged, expired, replayed or not for this delivery;
 * - 503: it may be good but cannot be checked yet (the hub's keys are out of reach, or an
 *   unknown key was asked for moments ago): the hub retries the attempt.
 *
 * The keys are fetched on first use and cached; fetched again when a token names an
 * unknown `kid` (a rotation) at most once every `refetchIntervalMs`, so forged `kid` values
 * cannot make the agent hammer its hub, and when the cache is older than `maxAgeMs`.
 */

import { createHash, createPublicKey, timingSafeEqual, verify, type KeyObject } from "node:crypto";

export const ALGORITHM = "EdDSA";
export const JWKS_PATH = "/.well-known/jwks.json";
export const DEFAULT_LEEWAY_S = 30;
export const MAX_TTL_S = 900;
const REQUIRED = ["iss", "sub", "aud", "task_id", "attempt_seq", "method", "body_sha256", "iat", "exp", "jti"] as const;

/** The `body_sha256` of a delivery body: hex sha256 of its exact bytes. */
export function bodyDigest(raw: Buffer | Uint8Array | string): string {
  return createHash("sha256").update(raw).digest("hex");
}

/** Why a delivery's token was not accepted, as the agent answers it. */
export class Refusal {
  constructor(
    /** 401 refused; 503 cannot be checked now (the hub retries). */
    readonly status: number,
    readonly message: string,
  ) {}

  answer(): [number, Record<string, unknown>] {
    return [this.status, { code: this.status, message: this.message }];
  }
}

export interface TokenVerifierOptions {
  /** Pin the hub's `security.issuer`; unset accepts any (the signature is the proof). */
  issuer?: string;
  /** Clock skew allowed on `iat`/`exp`, in ms (30 s). */
  leewayMs?: number;
  /** At most one fetch of the keys this often, in ms (5 s). */
  refetchIntervalMs?: number;
  /** Keys older than this are fetched again, in ms (60 s). */
  maxAgeMs?: number;
  maxSeen?: number;
  /** Wall clock in ms, like `Date.now` (tests pass their own). */
  clock?: () => number;
  /** Monotonic ms, like `performance.now`, for the key cache (tests pass their own). */
  timer?: () => number;
  /** Fetches the JWKS document; defaults to `GET <hub>/.well-known/jwks.json`. */
  fetchKeys?: () => Promise<unknown>;
  timeoutMs?: number;
}

/** The credential of an `Authorization: Bearer <credential>` header, or null. */
export function bearerOf(header: string | null | undefined): string | null {
  if (!header) return null;
  const trimmed = header.trim();
  const space = trimmed.indexOf(" ");
  if (space < 0) return null;
  const value = trimmed.slice(space + 1).trim();
  if (trimmed.slice(0, space).toLowerCase() !== "bearer" || !value) return null;
  return value;
}

/** What a token is checked against: the delivery as the agent got it. */
export interface DeliveryFacts {
  /** The body's `task_id` and `attempt_seq` (an integer is required). */
  taskId: unknown;
  attemptSeq: unknown;
  /** The method the delivery was posted to. */
  method: string;
  /** `bodyDigest` of the body's bytes as received. */
  bodySha256: string;
}

/** Why an agent refuses a token with these (signature-checked) claims, or null; `now` and
 * `leeway` in seconds, as the claims are. */
export function checkClaims(
  claims: Record<string, unknown>,
  expectedAudience: string,
  delivery: DeliveryFacts,
  now: number,
  leeway: number = DEFAULT_LEEWAY_S,
  issuer?: string,
): string | null {
  const missing = REQUIRED.filter((name) => !(name in claims));
  if (missing.length) return `token lacks claims: ${missing.join(", ")}`;
  for (const name of ["iss", "sub", "task_id", "method", "body_sha256", "jti"]) {
    const v = claims[name];
    if (typeof v !== "string" || !v) return `token claim ${name} is not a non-empty string`;
  }
  for (const name of ["iat", "exp"]) {
    const v = claims[name];
    if (typeof v !== "number" || !Number.isFinite(v)) return `token claim ${name} is not a finite number`;
  }
  if (!Number.isInteger(claims["attempt_seq"])) return "token claim attempt_seq is not an integer";
  if (issuer !== undefined && claims["iss"] !== issuer) return "token issued by another issuer";
  if (typeof claims["aud"] !== "string" || claims["aud"] !== expectedAudience) {
    return `token is meant for another agent, not '${expectedAudience}'`;
  }
  const iat = claims["iat"] as number;
  const exp = claims["exp"] as number;
  if (exp <= iat) return "token expires before it was issued";
  if (exp - iat > MAX_TTL_S) return `token lifetime exceeds ${MAX_TTL_S} s`;
  if (iat > now + leeway) return "token issued in the future";
  if (exp + leeway <= now) return "token expired";
  if (claims["task_id"] !== delivery.taskId) return "token is for another task";
  if (!Number.isInteger(delivery.attemptSeq)) {
    return "delivery body names no attempt_seq (an integer): the token cannot be matched";
  }
  if (claims["attempt_seq"] !== delivery.attemptSeq) return "token is for another attempt";
  if (claims["method"] !== delivery.method) return "token is for another method";
  const signed = Buffer.from(String(claims["body_sha256"]));
  const got = Buffer.from(delivery.bodySha256);
  if (signed.length !== got.length || !timingSafeEqual(signed, got)) {
    return "token was signed for another body: the delivery's payload or fields differ";
  }
  return null;
}

function b64json(segment: string): Record<string, unknown> | null {
  try {
    const value: unknown = JSON.parse(Buffer.from(segment, "base64url").toString("utf8"));
    return value !== null && typeof value === "object" && !Array.isArray(value)
      ? (value as Record<string, unknown>)
      : null;
  } catch {
    return null;
  }
}

const B64URL = /^[A-Za-z0-9_-]*$/;

/** Checks the reach tokens of deliveries to `agentId`. */
export class TokenVerifier {
  readonly issuer: string | undefined;
  readonly leeway: number;
  readonly refetchInterval: number;
  readonly maxAge: number;
  readonly maxSeen: number;
  private readonly clock: () => number;
  private readonly timer: () => number;
  private readonly fetchKeys: () => Promise<unknown>;
  private keys = new Map<string, KeyObject>();
  private fetchedAt: number | null = null; // last successful fetch (monotonic s)
  private triedAt: number | null = null; // last fetch attempt (monotonic s)
  private inFlight: Promise<boolean> | null = null;
  // jti -> wall-clock second until which its token could still be accepted (insertion order)
  private readonly seen = new Map<string, number>();

  constructor(
    readonly hub: string,
    readonly agentId: string,
    opts: TokenVerifierOptions = {},
  ) {
    this.issuer = opts.issuer;
    this.leeway = (opts.leewayMs ?? DEFAULT_LEEWAY_S * 1000) / 1000;
    this.refetchInterval = (opts.refetchIntervalMs ?? 5000) / 1000;
    this.maxAge = (opts.maxAgeMs ?? 60_000) / 1000;
    this.maxSeen = opts.maxSeen ?? 200_000;
    const clock = opts.clock ?? Date.now;
    const timer = opts.timer ?? (() => performance.now());
    this.clock = () => clock() / 1000;
    this.timer = () => timer() / 1000;
    const timeoutMs = opts.timeoutMs ?? 5000;
    this.fetchKeys =
      opts.fetchKeys ??
      (async () => {
        const res = await fetch(hub.replace(/\/+$/, "") + JWKS_PATH, {
          signal: AbortSignal.timeout(timeoutMs),
        });
        if (!res.ok) throw new Error(`HTTP ${res.status}`);
        return res.json();
      });
  }

  /** null if the delivery's token is good (its jti is now spent), else the refusal. `body`
   * is the parsed body, `raw` its bytes as received and `method` the one posted to: the
   * token binds all three. */
  async check(
    authorization: string | null | undefined,
    body: Record<string, unknown>,
    method: string,
    raw: Buffer | Uint8Array | string,
  ): Promise<Refusal | null> {
    const token = bearerOf(authorization);
    if (token === null) return new Refusal(401, "no reach token (expected 'Authorization: Bearer <token>')");
    const parts = token.split(".");
    if (parts.length !== 3 || !parts.every((p) => B64URL.test(p))) return new Refusal(401, "malformed reach token");
    const [h, p, s] = parts as [string, string, string];
    const header = b64json(h);
    if (header === null) return new Refusal(401, "malformed reach token");
    if (header["alg"] !== ALGORITHM) return new Refusal(401, `reach token not signed with ${ALGORITHM}`);
    const kid = header["kid"];
    if (typeof kid !== "string" || !kid) return new Refusal(401, "reach token names no signing key (kid)");
    const key = await this.key(kid);
    if (key instanceof Refusal) return key;
    let good: boolean;
    try {
      good = verify(null, Buffer.from(`${h}.${p}`), key, Buffer.from(s, "base64url"));
    } catch {
      good = false;
    }
    if (!good) return new Refusal(401, "reach token signature does not verify");
    const claims = b64json(p);
    if (claims === null) return new Refusal(401, "malformed reach token");
    const now = this.clock();
    const delivery: DeliveryFacts = {
      taskId: body["task_id"],
      attemptSeq: body["attempt_seq"],
      method,
      bodySha256: bodyDigest(raw),
    };
    const reason = checkClaims(claims, this.agentId, delivery, now, this.leeway, this.issuer);
    if (reason !== null) return new Refusal(401, reason);
    // no await from here on: the check and the spend of the jti are one step
    const jti = claims["jti"] as string;
    const until = this.seen.get(jti);
    if (until !== undefined && until > now) return new Refusal(401, "reach token already used (replayed jti)");
    this.seen.delete(jti);
    this.seen.set(jti, (claims["exp"] as number) + this.leeway);
    this.forget(now);
    return null;
  }

  private forget(now: number): void {
    for (const [jti, until] of this.seen) {
      if (this.seen.size <= this.maxSeen && until > now) break;
      this.seen.delete(jti);
    }
  }

  /** The public key `kid` names, fetching the hub's keys if due; or a `Refusal`. */
  private async key(kid: string): Promise<KeyObject | Refusal> {
    const now = this.timer();
    const known = this.keys.get(kid);
    const due = this.fetchedAt === null || now - this.fetchedAt >= this.maxAge;
    if (known !== undefined && !due) return known;
    if (this.inFlight !== null) {
      const fetched = await this.inFlight;
      return this.keys.get(kid) ?? (fetched ? unpublished() : unavailable());
    }
    if (this.triedAt === null || now - this.triedAt >= this.refetchInterval) {
      this.triedAt = now;
      this.inFlight = this.fetch(now);
      let fetched: boolean;
      try {
        fetched = await this.inFlight;
      } finally {
        this.inFlight = null;
      }
      return this.keys.get(kid) ?? (fetched ? unpublished() : unavailable());
    }
    if (known !== undefined) return known; // a refresh is due but was tried moments ago
    return new Refusal(
      503,
      "reach token signed by a key this agent does not know; the hub's keys were fetched moments ago: retry",
    );
  }

  /** Replace the cached keys with the hub's; false (cache kept) if it cannot say. */
  private async fetch(now: number): Promise<boolean> {
    let doc: unknown;
    try {
      doc = await this.fetchKeys();
    } catch (err) {
      console.warn(`reach: could not fetch the hub's signing keys from ${this.hub}: ${String(err)}`);
      return false;
    }
    const found = (doc as { keys?: unknown } | null)?.keys;
    if (!Array.isArray(found)) return false;
    const keys = new Map<string, KeyObject>();
    for (const jwk of found as Array<Record<string, unknown>>) {
      if (!jwk || jwk["kty"] !== "OKP" || jwk["crv"] !== "Ed25519" || typeof jwk["x"] !== "string") continue;
      try {
        keys.set(String(jwk["kid"]), createPublicKey({ key: { kty: "OKP", crv: "Ed25519", x: jwk["x"] }, format: "jwk" }));
      } catch {
        // a malformed key in the hub's JWKS: ignored
      }
    }
    this.keys = keys;
    this.fetchedAt = now;
    return true;
  }
}

function unpublished(): Refusal {
  return new Refusal(401, "reach token signed by a key the hub does not publish");
}

function unavailable(): Refusal {
  return new Refusal(503, "cannot check the reach token: the hub's keys are unavailable");
}
