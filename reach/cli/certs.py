"""``reach certs``: the hub CA and agent certificates for L1 (mutual TLS) agents.

Run on the hub host: the CA key never leaves ``<storage.home>/certs`` (or ``--dir``).
These commands print file paths and names, never key material.

Exit codes: 0 done, 2 bad input (or no CA yet), 1 refused (a CA exists; ``--force``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, NoReturn

import typer
from rich.console import Console

from reach.errors import ConfigError

certs_app = typer.Typer(
    help="Certificates for L1 agents: the hub CA and agent certs (run on the hub host).",
    no_args_is_help=True,
)
console = Console(soft_wrap=True, highlight=False)
err_console = Console(stderr=True, soft_wrap=True, highlight=False)

BAD_INPUT = 2
REFUSED = 1

DirOption = Annotated[
    Path | None,
    typer.Option("--dir", help="Where the CA lives (default: <storage.home>/certs)"),
]


def _die(message: str, code: int) -> NoReturn:
    err_console.print(message, markup=False)
    raise typer.Exit(code)


def _certs_dir(given: Path | None) -> Path:
    if given is not None:
        return given.expanduser().resolve()
    from reach.hub.settings import load_settings

    try:
        settings = load_settings()
    except ConfigError as exc:
        _die(f"configuration error: {exc}", BAD_INPUT)
    return settings.storage.home_path / "certs"


@certs_app.command("init")
def init(
    force: Annotated[
        bool, typer.Option("--force", help="Replace an existing CA (reissue every agent cert)")
    ] = False,
    hub_name: Annotated[
        str, typer.Option("--hub-name", help="Name in the CA's subject")
    ] = "agent-reach",
    directory: DirOption = None,
) -> None:
    """Create the hub CA and the hub's client certificate."""
    from reach.hub.security.certs import init_ca

    where = _certs_dir(directory)
    try:
        files = init_ca(where, hub_name=hub_name, force=force)
    except FileExistsError as exc:
        _die(f"refused: {exc}", REFUSED)
    except OSError as exc:
        _die(f"cannot write {where}: {exc}", BAD_INPUT)
    console.print(f"hub CA           {files.ca_cert}")
    console.print(f"hub CA key       {files.ca_key}  (mode 0600: keep it on this host)")
    console.print(f"hub client cert  {files.hub_cert}")
    console.print(f"hub client key   {files.hub_key}  (mode 0600)")
    console.print(
        "next: reach certs issue AGENT_ID --host <the agent's host>, then "
        "reach agents trust AGENT_ID L1"
    )


@certs_app.command("issue")
def issue(
    agent_id: Annotated[str, typer.Argument(help="The agent the certificate is for")],
    host: Annotated[
        list[str] | None,
        typer.Option(
            "--host",
            help="A DNS name or IP the hub reaches the agent at (repeatable; "
            "default 127.0.0.1 and localhost)",
        ),
    ] = None,
    out: Annotated[
        Path | None, typer.Option("--out", help="Output directory (default: <certs>/agents)")
    ] = None,
    days: Annotated[int, typer.Option("--days", min=1, help="Validity in days")] = 365,
    directory: DirOption = None,
) -> None:
    """Issue an agent certificate and key signed by the hub CA."""
    from reach.hub.security.certs import DEFAULT_HOSTS, issue_agent_cert

    where = _certs_dir(directory)
    try:
        issued = issue_agent_cert(
            where, agent_id, tuple(host) if host else DEFAULT_HOSTS, out, days
        )
    except (FileNotFoundError, ValueError) as exc:
        _die(str(exc), BAD_INPUT)
    except OSError as exc:
        _die(f"cannot write the certificate: {exc}", BAD_INPUT)
    console.print(f"agent cert  {issued.cert}")
    console.print(f"agent key   {issued.key}  (mode 0600: copy it to the agent host only)")
    console.print(f"hub CA      {issued.ca_cert}")
    console.print(f"identity    {issued.identity_name}")
    console.print(f"hosts       {', '.join(issued.hosts)}")
    console.print(f"expires     {issued.not_after:%Y-%m-%d %H:%M} UTC")
    console.print(
        f'serve with: reach.TLSConfig(cert="{issued.cert.name}", key="{issued.key.name}", '
        f'ca="{issued.ca_cert.name}") and an https:// addr'
    )
