"""A real HTTP process that receives the hub's callbacks and records each request.

Every POST is appended (headers, base64 body) as one JSON line to ``--journal``. The
path says how to answer: ``/ok/...`` 204; ``/fail/<n>/...`` 503 to the first ``n``
requests of that path, then 204; ``/reject/...`` 400.

Run as a process::

    python -m tests.support.callback_receiver --port P --journal FILE
"""

from __future__ import annotations

import argparse
import base64
import json
import subprocess
import sys
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tests.support import processes

REPO = Path(__file__).resolve().parents[2]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--journal", required=True)
    args = parser.parse_args()
    lock = threading.Lock()
    seen: Counter[str] = Counter()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            parts = self.path.strip("/").split("/")
            with lock:
                seen[self.path] += 1
                count = seen[self.path]
                status = 204
                if parts[0] == "fail" and count <= int(parts[1]):
                    status = 503
                elif parts[0] == "reject":
                    status = 400
                record = {
                    "path": self.path,
                    "headers": dict(self.headers.items()),
                    "body": base64.b64encode(body).decode(),
                    "answered": status,
                }
                with open(args.journal, "a") as f:
                    f.write(json.dumps(record) + "\n")
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    server.daemon_threads = True
    print("listening", flush=True)
    server.serve_forever()


class CallbackReceiverProcess:
    """This module as its own process; `requests` reads what it received."""

    def __init__(self, port: int, journal: Path) -> None:
        self.port = port
        self.journal = journal
        self.url = f"http://127.0.0.1:{port}"
        args = [sys.executable, "-m", "tests.support.callback_receiver", "--port", str(port)]
        args += ["--journal", str(journal)]
        with journal.with_suffix(".out").open("ab") as out:
            self.proc = subprocess.Popen(args, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)

    def requests(self, path_prefix: str = "") -> list[dict[str, Any]]:
        """What was received (on paths starting with ``path_prefix``), in order; each
        with its raw ``body`` bytes."""
        if not self.journal.exists():
            return []
        found = []
        for line in self.journal.read_text().splitlines():
            if not line.strip():
                continue
            record = json.loads(line)
            if record["path"].startswith(path_prefix):
                record["body"] = base64.b64decode(record["body"])
                found.append(record)
        return found

    def stop(self) -> None:
        processes.stop(self.proc)


if __name__ == "__main__":
    main()
