"""Where the repository is: hub and agent processes run from its root."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
