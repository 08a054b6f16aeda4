"""An MCP server built only with the ``mcp`` package's ``MCPServer``: what a team that never
heard of Agent-Reach runs. The hub registers it with ``reach agents add-mcp URL`` and calls
its tools over Streamable HTTP.

Tools:

* ``echo``: ``{"text": ..., "by": "mcp-tools"}`` as structured content.
* ``slow``: works ``seconds`` (asyncio), then answers ``{"slept": seconds}``.
* ``steps``: reports progress ``steps`` times (``step i``, i of steps), then ``{"steps": n}``.
* ``fail``: raises, so the call answers ``isError``.
* ``big``: answers ``{"text": "x" * size}`` (past the hub's answer cap when size is).
* ``--extra NAME`` (repeatable): one more tool named NAME, answering ``{"tool": NAME}``.
* ``--without NAME`` (repeatable): leave a tool out (a changed tool list on restart).

Every call is appended to ``--journal`` (one JSON line: tool, arguments) before the work
starts, so a killed process's counts survive it. Run as ``python -m
tests.support.mcp_tool_server --port P --journal FILE [--extra NAME] [--without NAME]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import Context, MCPServer

from tests.support import processes

REPO = Path(__file__).resolve().parents[2]
TOOLS = ("echo", "slow", "steps", "fail", "big")


def build(journal: Path, extra: list[str], without: list[str]) -> MCPServer:
    server = MCPServer("Tool Server", instructions="tools for the hub's tests")

    def note(tool: str, arguments: dict[str, Any]) -> None:
        with journal.open("a") as out:
            out.write(json.dumps({"tool": tool, "arguments": arguments}) + "\n")

    async def echo(text: str) -> dict[str, Any]:
        """Echo the text back."""
        note("echo", {"text": text})
        return {"text": text, "by": "mcp-tools"}

    async def slow(seconds: float) -> dict[str, Any]:
        """Work for a while, then answer."""
        note("slow", {"seconds": seconds})
        await asyncio.sleep(seconds)
        return {"slept": seconds}

    async def steps(steps: int, ctx: Context) -> dict[str, Any]:
        """Report progress step by step."""
        note("steps", {"steps": steps})
        for i in range(1, steps + 1):
            await ctx.report_progress(i, steps, f"step {i}")
            await asyncio.sleep(0.05)
        return {"steps": steps}

    async def fail(order_id: str) -> dict[str, Any]:
        """Always fails."""
        note("fail", {"order_id": order_id})
        raise ValueError("no such order")

    async def big(size: int) -> dict[str, Any]:
        """A large answer."""
        note("big", {"size": size})
        return {"text": "x" * size}

    for fn in (echo, slow, steps, fail, big):
        if fn.__name__ not in without:
            server.add_tool(fn, name=fn.__name__)
    for name in extra:

        async def named(tool: str = name) -> dict[str, Any]:
            note(tool, {})
            return {"tool": tool}

        server.add_tool(named, name=name, description=f"the extra tool {name}")
    return server


class McpToolServer:
    """The tool server as its own process, killable with SIGKILL and restartable on its
    port with another tool list."""

    def __init__(self, port: int, journal: Path, *extra: str) -> None:
        self.port = port
        self.journal = journal
        self.proc: subprocess.Popen[bytes] | None = None
        self.start(*extra)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def start(self, *extra: str) -> None:
        args = [sys.executable, "-m", "tests.support.mcp_tool_server", "--port", str(self.port)]
        with self.journal.with_suffix(".log").open("ab") as log:
            self.proc = subprocess.Popen(
                [*args, "--journal", str(self.journal), *extra],
                cwd=REPO,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def kill(self) -> None:
        processes.kill(self.proc)

    def restart(self, *extra: str) -> None:
        """SIGKILL the server and start it again on the same port (``extra``: its args)."""
        self.kill()
        self.start(*extra)

    def calls(self) -> Counter[str]:
        """How many times each tool was called."""
        if not self.journal.exists():
            return Counter()
        lines = self.journal.read_text().splitlines()
        return Counter(json.loads(line)["tool"] for line in lines if line.strip())

    def stop(self) -> None:
        processes.stop(self.proc)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--journal", type=Path, required=True)
    parser.add_argument("--extra", action="append", default=[])
    parser.add_argument("--without", action="append", default=[])
    args = parser.parse_args()
    server = build(args.journal, args.extra, args.without)
    server.run("streamable-http", host="127.0.0.1", port=args.port)


if __name__ == "__main__":
    main()
