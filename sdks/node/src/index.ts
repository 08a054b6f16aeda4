/**
 * Agent-Reach for Node.js: the same concepts and names as the Python SDK (`reach`).
 * Agents: `Agent`, `ACCEPTED`. Callers: `send`, `waitForResult`, `broadcast`, `stream`.
 * Errors: one tree rooted at `ReachError`, built from the hub's problem types.
 */
export { Agent, ACCEPTED, type AgentOptions, type Delivery, type Handler, TokenVerifier, Refusal, checkClaims, IdempotencyGuard, AgentChannel } from "./agent.js";
export * from "./errors.js";
export { HubClient, defaultHubUrl, resolveApiKey, redact, type HubClientOptions, type RequestOptions } from "./http.js";
export * from "./caller.js";
export { stream, streamPath, parseSse, SseParser, StreamEvent, type SseEvent, type StreamOptions } from "./stream.js";
export * as wire from "./wire.js";
