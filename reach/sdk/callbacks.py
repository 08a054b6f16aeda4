"""Checking that a callback really comes from the hub, before acting on it.

The hub POSTs a task's result (``send(..., callback_url=)``) signed like its approval
webhooks -- a detached JWS in ``Reach-Signature`` by the key in its JWKS -- but typed
``reach-callback+json`` in the protected header, so a callback cannot be passed off as a
webhook nor the other way round. Pass the raw body bytes and the header; repeats carry
the same ``callback_id`` (delivery is at least once): drop the ones already handled.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from reach.core.notify.callbacks import CALLBACK_TYP
from reach.sdk.webhooks import verify_signed

__all__ = ["verify_callback"]


def verify_callback(
    body: bytes,
    signature: str,
    jwks: Mapping[str, Any] | None = None,
    *,
    hub: str | None = None,
) -> dict[str, Any]:
    """The callback's JSON body (``event``, ``callback_id``, ``task_id``, ``status``,
    ``result``, ``error``, ``context``) once its ``Reach-Signature`` verifies as a
    callback; `InvalidSignature` otherwise. ``jwks`` or ``hub`` as for `verify_webhook`."""
    return verify_signed(body, signature, jwks, hub=hub, typ=CALLBACK_TYP)
