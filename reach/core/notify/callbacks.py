"""Callbacks' wire format and rules, without I/O.

When a caller sends with ``callback_url``, the hub POSTs the task's terminal result (and,
with ``callback_progress``, each progress report) to it as canonical JSON, signed like
the approval webhook (``reach.core.notify.approval_webhook``: a detached JWS in ``Reach-Signature``)
but with ``"typ": "reach-callback+json"`` in the protected header: a receiver of one
cannot be handed the other (``reach.verify_callback`` requires the type,
``reach.verify_webhook`` refuses any). Each POST carries ``callback_id``, the same on
every retry, so a receiver drops repeats (delivery is at least once).

The URL is a server-side request chosen by a caller: it must be http(s) without
credentials and resolve to addresses the hub may call (`reach.core.security.networks`).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any, Final
from urllib.parse import urlsplit

from reach.core.delivery.retry import RetryPolicy, backoff_delay
from reach.core.security.networks import Network, NetworkRule

__all__ = [
    "CALLBACK_TYP",
    "MAX_URL_LENGTH",
    "next_delay",
    "progress_body",
    "result_body",
    "rule_of",
    "url_refusal",
]

CALLBACK_TYP: Final = "reach-callback+json"
MAX_URL_LENGTH: Final = 512  # the tasks.callback_url column


def url_refusal(
    url: str,
    allow_private: bool,
    resolve: Callable[[str, int], Sequence[str]],
    networks: Sequence[Network] = (),
) -> str | None:
    """Why the hub will not POST to ``url``, or None. The shape is checked always, and
    every address ``resolve`` gives (one refused address refuses the whole name) by
    `reach.core.security.networks`: public addresses, the operator's ``networks``, and with
    ``allow_private`` loopback and private ones too; link-local never. A name that does
    not resolve raises ``OSError``."""
    if len(url) > MAX_URL_LENGTH:
        return f"the URL is longer than {MAX_URL_LENGTH} characters"
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        return f"not a URL: {exc}"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "not an http(s) URL with a host"
    if parts.username is not None or parts.password is not None:
        return "credentials in the URL (they would be sent and logged in the clear)"
    if parts.fragment:
        return "a URL fragment (never sent to a server)"
    rule = rule_of(allow_private, networks)
    addresses = resolve(parts.hostname, port or (443 if parts.scheme == "https" else 80))
    if not addresses:
        raise OSError(f"{parts.hostname} resolves to no address")
    why = rule.first_refusal(addresses)
    if why is not None:
        setting = " (callbacks.allow_private is off)" if not allow_private else ""
        return f"{parts.hostname}: {why}{setting}"
    return None


def rule_of(allow_private: bool, networks: Sequence[Network] = ()) -> NetworkRule:
    """The addresses callbacks may go to (`reach.core.security.networks`)."""
    return NetworkRule(loopback=allow_private, private=allow_private, networks=tuple(networks))


def next_delay(attempts: int, base: float, cap: float, rng: random.Random) -> float:
    """The wait before retry ``attempts`` (1 = the first retry): jittered exponential."""
    policy = RetryPolicy(max_retry=max(attempts, 1), base=base, cap=max(cap, base))
    return backoff_delay(attempts, policy, rng)


def result_body(callback_id: int, task: dict[str, Any], context: Any) -> dict[str, Any]:
    """What a receiver gets when the task ends: its result and the caller's context."""
    return {
        "event": "task_result",
        "callback_id": callback_id,
        "task_id": task["task_id"],
        "status": task["status"],
        "result": task["result"],
        "error": task["error"],
        "finished_at": task["finished_at"],
        "context": context,
    }


def progress_body(
    callback_id: int, task_id: str, event_id: int | None, progress: dict[str, Any], context: Any
) -> dict[str, Any]:
    """What a receiver that asked for progress gets for one report."""
    return {
        "event": "task_progress",
        "callback_id": callback_id,
        "task_id": task_id,
        "event_id": event_id,
        "progress": progress,
        "context": context,
    }
