"""Persistence: SQLAlchemy models, engine set-up and Alembic migrations (SQLite and PostgreSQL)."""

from reach.hub.storage.engine import (
    create_engine_for,
    read_session_factory,
    session_factory,
    upgrade_database,
)

__all__ = ["create_engine_for", "read_session_factory", "session_factory", "upgrade_database"]
