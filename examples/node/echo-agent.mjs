// A Node.js agent for Agent-Reach: `node examples/node/echo-agent.mjs` against a running hub
// (`reach up`; REACH_HUB_URL and REACH_API_KEY as for the Python SDK). It answers `echo`
// at once and `slow.echo` with 202, progress, then a report. SIGINT/SIGTERM deregister it.
// Build the SDK first: (cd sdks/node && npm install && npm run build).
import { Agent, ACCEPTED } from "../../sdks/node/dist/index.js";

const port = Number(process.env.ECHO_PORT ?? 7101);
const agent = new Agent({
  agentId: process.env.ECHO_AGENT_ID ?? "node-echo",
  tags: ["echo", "node"],
  addr: `127.0.0.1:${port}`,
  allowLoopback: true, // local development: the hub dials 127.0.0.1
  heartbeatInterval: Number(process.env.ECHO_HEARTBEAT ?? 5000), // ms
});

agent.route("echo", (taskId, payload) => ({ echo: payload, task_id: taskId }));

agent.route("slow.echo", (taskId, payload) => {
  setTimeout(async () => {
    await agent.reportProgress(taskId, 0.5, "halfway");
    await agent.reportResult(taskId, { echo: payload, later: true });
  }, Number(payload.delay_ms ?? 200));
  return ACCEPTED; // the hub sees 202 and waits for the report
});

await agent.serve(); // until SIGINT/SIGTERM, then deregisters
console.log(`${agent.agentId} stopped`);
