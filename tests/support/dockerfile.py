"""The Dockerfile's final stage as data, for tests on a machine without a Docker engine:
what ``docker run IMAGE ARGS`` would execute, with which environment, where and as whom.

Only what the image's own Dockerfile uses is read (exec-form ENTRYPOINT, CMD and VOLUME,
``ENV k=v …``, WORKDIR, USER, COPY with flags); anything else in the final stage is kept
as raw text and ignored.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.paths import REPO

DOCKERFILE = REPO / "Dockerfile"


@dataclass
class Stage:
    entrypoint: list[str] = field(default_factory=list)
    cmd: list[str] = field(default_factory=list)
    volumes: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    workdir: str = "/"
    user: str = "root"
    copies: list[tuple[list[str], str, dict[str, str]]] = field(default_factory=list)

    def argv(self, *run_args: str) -> list[str]:
        """``docker run IMAGE run_args…``: the entrypoint, then the arguments or CMD."""
        return [*self.entrypoint, *(run_args or self.cmd)]

    def copied_to(self, destination: str) -> Path:
        """The source in the build context of a COPY (not ``--from``) to ``destination``."""
        for sources, dest, flags in self.copies:
            if dest.rstrip("/") == destination.rstrip("/") and "from" not in flags:
                (source,) = sources
                return REPO / source
        raise AssertionError(f"nothing in the Dockerfile is copied to {destination}")


def _instructions(text: str) -> list[tuple[str, str]]:
    """(KEYWORD, arguments) per instruction: comments dropped, continuations joined."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or (line.startswith("#") and not pending):
            continue
        if line.startswith("#"):  # a comment inside a continued instruction
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        whole = pending + line
        pending = ""
        keyword, _, rest = whole.partition(" ")
        out.append((keyword.upper(), rest.strip()))
    return out


def _exec_form(value: str) -> list[str]:
    parsed = json.loads(value)
    assert isinstance(parsed, list), f"not the exec form: {value}"
    return [str(part) for part in parsed]


def _expand(value: str, env: dict[str, str]) -> str:
    return re.sub(r"\$\{?(\w+)\}?", lambda m: env.get(m.group(1), ""), value)


def final_stage(path: Path = DOCKERFILE) -> Stage:
    stages: list[list[tuple[str, str]]] = []
    for keyword, rest in _instructions(path.read_text(encoding="utf-8")):
        if keyword == "FROM":
            stages.append([])
        elif stages:
            stages[-1].append((keyword, rest))
    stage = Stage()
    for keyword, rest in stages[-1]:
        if keyword == "ENTRYPOINT":
            stage.entrypoint = _exec_form(rest)
        elif keyword == "CMD":
            stage.cmd = _exec_form(rest)
        elif keyword == "VOLUME":
            stage.volumes += _exec_form(rest) if rest.startswith("[") else rest.split()
        elif keyword == "ENV":
            for pair in shlex.split(rest):
                name, _, value = pair.partition("=")
                # the image's PATH builds on the base image's; here: on the test's own
                stage.env[name] = _expand(value, {"PATH": "$PATH", **stage.env})
        elif keyword == "WORKDIR":
            stage.workdir = rest
        elif keyword == "USER":
            stage.user = rest
        elif keyword == "COPY":
            words = shlex.split(rest)
            flags = dict(w[2:].partition("=")[::2] for w in words if w.startswith("--"))
            plain = [w for w in words if not w.startswith("--")]
            stage.copies.append((plain[:-1], plain[-1], flags))
    return stage
