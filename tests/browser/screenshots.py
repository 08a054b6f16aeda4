"""Screenshots of every dashboard page, for the README: ``scripts/screenshots``.

Starts its own demo hub (`tests.browser.demo`: API keys required, the five demo agents and
two test agents), gives it a little history through the API (finished and failed tasks, a
task that reported progress, a dead letter, a task parked for approval, a DAG run, an
agent gone offline), signs in as an admin in headless chromium and writes one PNG per page
of `PAGES` to ``docs/screenshots/<page>.png``. ``tests/browser/test_screenshots.py`` checks
that every page has its file and that the README shows or links each one.

    python -m tests.browser.screenshots [--out docs/screenshots]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from playwright.sync_api import Page, sync_playwright

from tests.browser import chromium
from tests.browser.demo import FLAKY, FLAKY_METHOD, SLOW, DemoHub, demo_hub
from tests.support.paths import REPO
from tests.support.waiting import wait_until

OUT = REPO / "docs" / "screenshots"
# page name -> what it shows (the README's tour links each file)
PAGES = {
    "login": "sign-in with an API key",
    "fleet": "the fleet: agents, instances, ReachScores",
    "instance": "one instance: its score, probes, events",
    "tasks": "tasks, filtered by status and agent",
    "task": "one task, live over SSE",
    "dag-runs": "DAG runs",
    "dag-run": "one DAG run: its nodes",
    "dead-letters": "dead letters, replayed one or many at a time",
    "approvals": "tasks awaiting a human decision",
    "alerts": "alerts: offline agents, breakers, backpressure",
}


def seed(hub: DemoHub) -> dict[str, str]:
    """Give the hub some history; the ids the per-item pages show."""
    for region in ("east", "west", "north"):
        hub.submit(capability="sales.fetch", method="sales.fetch", payload={"region": region})
    failed = hub.submit(capability="sales.fetch", method="sales.fetch", payload={"region": "south"})
    hub.submit(capability="text.summarize", method="text.summarize", payload={"text": "x " * 40})
    # held after its second step (until the gate file exists): the task page shows it live
    gate = hub.home / "screenshot-gate"
    slow = hub.submit(
        agent_id=SLOW,
        method="work.do",
        payload={"steps": 4, "interval": 0.2, "gate_after": 2, "gate": str(gate)},
    )
    dead = hub.submit(agent_id=FLAKY, method=FLAKY_METHOD, payload={"report": "q3"})
    parked = hub.submit(
        capability="orders.cancel",
        method="orders.cancel",
        payload={"order_id": "A-1042", "reason": "customer asked"},
    )
    dag = json.loads((REPO / "dags" / "sales_analysis_flow.json").read_text())
    r = hub.api("POST", "/api/v1/dag-runs", {"dag": dag, "input": {"region": "west"}}, hub.caller)
    assert r.status_code == 201, r.text
    run_id = str(r.json()["run_id"])
    wait_until(lambda: _progress_reports(hub, slow) >= 2, 30, what=f"{slow} half-way")
    hub.wait_status(failed, "failed")
    hub.wait_status(parked, "awaiting_approval")
    wait_until(lambda: hub.dead_letter_of(dead), 30, what="the flaky agent's dead letter")
    wait_until(
        lambda: hub.api("GET", f"/api/v1/dag-runs/{run_id}").json()["status"] != "running",
        30,
        what=f"DAG run {run_id} finished",
    )
    # an alert: the flaky agent leaves without deregistering (its heartbeats stop)
    hub.agents[FLAKY].kill()
    hub.agents[FLAKY].wait()
    wait_until(lambda: not hub.online(FLAKY), 30, what=f"{FLAKY} no longer online")
    sales = hub.api("GET", "/api/v1/agents/sales-agent-01").json()["instances"][0]
    return {"task": slow, "gate": str(gate), "instance": str(sales["instance_id"]), "run": run_id}


def _progress_reports(hub: DemoHub, task_id: str) -> int:
    r = hub.api("GET", f"/v1/tasks/{task_id}/events")
    assert r.ok, r.text
    return sum(1 for e in r.json()["events"] if e["kind"] == "progress")


def urls(ids: dict[str, str]) -> dict[str, str]:
    return {
        "login": "/ui/login",
        "fleet": "/ui",
        "instance": f"/ui/instances/{ids['instance']}",
        "tasks": "/ui/tasks",
        "task": f"/ui/tasks/{ids['task']}",
        "dag-runs": "/ui/dag-runs",
        "dag-run": f"/ui/dag-runs/{ids['run']}",
        "dead-letters": "/ui/dead-letters",
        "approvals": "/ui/approvals",
        "alerts": "/ui/alerts",
    }


def shoot(page: Page, path: str, out: Path) -> None:
    page.goto(path)
    if path.startswith("/ui/tasks/"):  # live: its stream never idles; wait for its first update
        page.get_by_test_id("task-progress").wait_for()
    else:
        page.wait_for_load_state("networkidle")
    page.screenshot(path=str(out), full_page=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with (
        tempfile.TemporaryDirectory(prefix="reach-screenshots-") as tmp,
        demo_hub(Path(tmp)) as hub,
        sync_playwright() as p,
    ):
        ids = seed(hub)
        browser = chromium.launch(p.chromium)
        try:
            context = browser.new_context(
                base_url=hub.url,
                viewport=chromium.VIEWPORT,
                device_scale_factor=1,
            )
            page = context.new_page()
            targets = urls(ids)
            shoot(page, targets["login"], args.out / "login.png")
            chromium.sign_in(page, hub.admin.secret)
            for name in PAGES:
                if name != "login":
                    shoot(page, targets[name], args.out / f"{name}.png")
                print(f"{args.out / name}.png")
            Path(ids["gate"]).touch()  # the live task may finish now
        finally:
            browser.close()


if __name__ == "__main__":
    main()
