"""docker-compose.yml: structure checks plus a real validation by a Compose CLI."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO_ROOT / "docker-compose.yml"

SERVICES = ("redis", "postgres", "api", "worker", "beat", "flower")
REACH_SERVICES = ("api", "worker", "beat", "flower")
EXPECTED_COMMANDS = {
    "migrate": ["reach", "db", "upgrade"],
    "api": ["reach", "api"],
    "worker": ["reach", "worker"],
    "beat": ["reach", "beat"],
    "flower": ["reach", "flower"],
}

INSTALL_HINT = (
    "No Compose CLI found to validate docker-compose.yml. Install one: "
    "`apt-get install -y --no-install-recommends docker-compose` (Debian package, "
    "provides `docker-compose`), or the Docker Compose v2 plugin (`docker compose`)."
)


def _load() -> dict[str, Any]:
    with COMPOSE_FILE.open(encoding="utf-8") as fh:
        data = yaml.safe_load(fh)
    assert isinstance(data, dict), "docker-compose.yml must be a mapping"
    return data


def _argv(command: str | list[str]) -> list[str]:
    return command.split() if isinstance(command, str) else [str(part) for part in command]


def test_compose_services_healthchecks_env_and_commands() -> None:
    services = _load()["services"]

    missing = [name for name in SERVICES if name not in services]
    assert not missing, f"services missing from docker-compose.yml: {missing}"

    for name in SERVICES:
        healthcheck = services[name].get("healthcheck")
        assert healthcheck, f"{name}: no healthcheck"
        assert not healthcheck.get("disable"), f"{name}: healthcheck disabled"
        assert healthcheck.get("test"), f"{name}: healthcheck has no test"

    for name in REACH_SERVICES:
        env = services[name].get("environment") or {}
        assert isinstance(env, dict), f"{name}: environment should be a mapping"
        for var in ("REACH_DATABASE_URL", "REACH_BROKER_URL", "REACH_RESULT_BACKEND"):
            assert env.get(var), f"{name}: {var} not set"
        assert env["REACH_DATABASE_URL"].startswith("postgresql+psycopg://")
        assert env["REACH_BROKER_URL"].startswith("redis://redis:6379/")

    for name, prefix in EXPECTED_COMMANDS.items():
        assert name in services, f"service {name} missing"
        argv = _argv(services[name]["command"])
        assert argv[: len(prefix)] == prefix, f"{name}: command {argv} should start with {prefix}"

    assert "--port" in _argv(services["flower"]["command"])
    assert "5555" in _argv(services["flower"]["command"])
    api_argv = _argv(services["api"]["command"])
    assert api_argv[api_argv.index("--port") + 1] == "8800"

    # Startup order: migrations finish before any long-running reach process.
    for name in ("api", "worker", "beat"):
        deps = services[name]["depends_on"]
        assert deps["migrate"]["condition"] == "service_completed_successfully", name
        assert deps["redis"]["condition"] == "service_healthy", name
        assert deps["postgres"]["condition"] == "service_healthy", name
    assert services["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"

    # Production runs with authentication on and its first keys made by a one-shot step.
    for name in REACH_SERVICES:
        assert services[name]["environment"]["REACH_SECURITY__REQUIRE_AUTH"] == "true", name
    init = services["security-init"]
    assert init["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    script = " ".join(_argv(init["command"]))
    assert "reach keys create --scope admin" in script
    assert "reach certs init" in script
    for name in ("api", "worker", "beat"):
        deps = services[name]["depends_on"]
        assert deps["security-init"]["condition"] == "service_completed_successfully", name

    worker_check = " ".join(_argv(services["worker"]["healthcheck"]["test"]))
    assert "celery -A reach.worker.app inspect ping" in worker_check
    api_check = " ".join(_argv(services["api"]["healthcheck"]["test"]))
    assert "http://127.0.0.1:8800/healthz" in api_check


def _compose_cli() -> list[str] | None:
    docker = shutil.which("docker")
    if docker:
        probe = subprocess.run(
            [docker, "compose", "version"], capture_output=True, text=True, check=False
        )
        if probe.returncode == 0:
            return [docker, "compose"]
    legacy = shutil.which("docker-compose")
    return [legacy] if legacy else None


def test_compose_file_validates_with_compose_cli() -> None:
    cli = _compose_cli()
    assert cli is not None, INSTALL_HINT
    result = subprocess.run(
        [*cli, "-f", str(COMPOSE_FILE), "config", "-q"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, (
        f"`{' '.join(cli)} config -q` failed ({result.returncode}):\n"
        f"{result.stdout}\n{result.stderr}"
    )
