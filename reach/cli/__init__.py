"""The ``reach`` command line (hub install): commands, rendering and the ``reach up`` supervisor."""

from reach.cli.commands import app, main

__all__ = ["app", "main"]
