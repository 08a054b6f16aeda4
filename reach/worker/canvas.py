"""DAG runs on Celery's canvas: each level of the plan is a group, consecutive groups make
chords, and a final task closes the run. This is the one domain-side module that knows
Celery; the plan it compiles is pure (``reach.core.orchestration.dags.compile_plan``).
"""

from __future__ import annotations

from typing import Any

from celery import chain, group

from reach.core.orchestration.dags import Plan


def canvas(app: Any, run_id: str, plan: Plan, from_level: int = 0) -> Any:
    """The run as a canvas (immutable signatures: nodes read state, not chord arguments).

    ``from_level`` resumes a run whose canvas died: the levels before it are done, and a
    node already finished returns its stored result at once."""
    levels = [
        group(
            app.signature("reach.dag_node", args=(run_id, node_id), immutable=True)
            for node_id in level
        )
        for level in plan.levels[from_level:]
    ]
    return chain(*levels, app.signature("reach.dag_finish", args=(run_id,), immutable=True))


def fan_out(app: Any, task_ids: list[str]) -> Any:
    """A broadcast's deliveries as one group: every target at once."""
    return group(
        app.signature(
            "reach.deliver",
            args=(task_id, 1),
            immutable=True,
            queue="reach",
            ignore_result=True,  # the store has the outcome; no result channel per target
        )
        for task_id in task_ids
    )
