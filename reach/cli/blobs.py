"""``reach blobs put FILE``: upload a large payload as a blob; send it with
``reach send METHOD --payload-ref ID`` (docs/guide/blobs.md).

Exit codes: 0 stored, 1 refused by the hub (too large, a key without the scope), 2 a file
that cannot be read.
"""

from __future__ import annotations

import json
import mimetypes
from pathlib import Path
from typing import Annotated

import typer

from reach.cli.common import err_console
from reach.cli.options import ApiKeyOption, HubOption, fail
from reach.errors import ReachError

__all__ = ["blobs_app"]

blobs_app = typer.Typer(
    help="Large payloads by reference: upload a blob, then send its id as --payload-ref.",
    no_args_is_help=True,
)


@blobs_app.command("put")
def put(
    path: Annotated[Path, typer.Argument(help="The file to upload")],
    content_type: Annotated[
        str | None, typer.Option(help="Its media type; unset: guessed from the name")
    ] = None,
    hub: HubOption = None,
    api_key: ApiKeyOption = None,
) -> None:
    """Upload FILE as a blob of this key's; prints its id, size and SHA-256 as JSON."""
    from reach.sdk.blobs import put_blob

    kind = content_type or mimetypes.guess_type(path.name)[0] or "application/octet-stream"
    try:
        with path.open("rb") as data:
            blob = put_blob(data, content_type=kind, hub=hub, api_key=api_key)
    except OSError as exc:
        err_console.print(f"[red]cannot read {path}:[/red] {exc.strerror}")
        raise typer.Exit(2) from None
    except ReachError as exc:
        fail(exc)
    print(
        json.dumps(
            {
                "blob_id": blob.blob_id,
                "size": blob.size,
                "sha256": blob.sha256,
                "content_type": blob.content_type,
                "unreferenced_until": blob.unreferenced_until,
            }
        )
    )
