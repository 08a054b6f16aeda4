"""The running hub checks the database against ``SCHEMA_HEAD`` without loading Alembic, so
the constant must name the newest migration."""

from __future__ import annotations

from alembic.script import ScriptDirectory

from reach.hub.storage.engine import SCHEMA_HEAD, alembic_config


def test_schema_head_is_the_newest_migration() -> None:
    script = ScriptDirectory.from_config(alembic_config("sqlite://"))
    heads = script.get_heads()
    assert heads == [SCHEMA_HEAD], (
        f"migrations end at {heads}: set SCHEMA_HEAD in reach/hub/storage/engine.py"
    )
