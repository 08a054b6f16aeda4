"""The running hub checks the database against ``SCHEMA_HEAD`` without loading Alembic, so
the constant must name the newest migration."""

from __future__ import annotations

from alembic.script import ScriptDirectory

from reach.hub.storage.engine import SCHEMA_HEAD, alembic_config
from reach.hub.storage.models import LIVE_TASK, OPEN_CLAIM


def test_schema_head_is_the_newest_migration() -> None:
    script = ScriptDirectory.from_config(alembic_config("sqlite://"))
    heads = script.get_heads()
    assert heads == [SCHEMA_HEAD], (
        f"migrations end at {heads}: set SCHEMA_HEAD in reach/hub/storage/engine.py"
    )


def test_the_live_index_predicate_is_the_models_one() -> None:
    """Migration 0019 froze ``ix_tasks_agent_live``'s predicate; the queue count spells
    the models' one. Autogenerate does not compare predicates, so this does: a status
    added to ``LIVE`` needs a migration that rebuilds the index."""
    script = ScriptDirectory.from_config(alembic_config("sqlite://"))
    migration = script.get_revision("0019").module
    assert migration.LIVE_TASK == LIVE_TASK


def test_the_open_claim_predicate_is_the_models_one() -> None:
    """Migration 0020 froze ``ix_outbox_claimed``'s predicate; the lapsed-claim net's
    query is proven to match it only while the models' ``OPEN_CLAIM`` says the same."""
    script = ScriptDirectory.from_config(alembic_config("sqlite://"))
    migration = script.get_revision("0020").module
    assert migration.OPEN_CLAIM == OPEN_CLAIM
