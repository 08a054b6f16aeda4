"""Callbacks' wire format and rules, without I/O.

When a caller sends with ``callback_url``, the hub POSTs the task's terminal result (and,
with ``callback_progress``, each progress report) to it as canonical JSON, signed like
every outbound POST (``reach.core.notify.outbound``: a detached JWS in ``Reach-Signature``)
but with ``"typ": "reach-callback+json"`` in the protected header: a receiver of one
cannot be handed the other (``reach.verify_callback`` requires the type,
``reach.verify_webhook`` refuses any). Each POST carries ``callback_id``, the same on
every retry, so a receiver drops repeats (delivery is at least once).

The URL is a server-side request chosen by a caller: it must be http(s) without
credentials and resolve to addresses the hub may call (`reach.core.security.networks`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from reach.core.notify.outbound import Resolver
from reach.core.notify.outbound import url_refusal as _url_refusal
from reach.core.security.networks import Network, NetworkRule

__all__ = [
    "CALLBACK_TYP",
    "progress_body",
    "result_body",
    "rule_of",
    "url_refusal",
]

CALLBACK_TYP: Final = "reach-callback+json"


def url_refusal(
    url: str,
    allow_private: bool,
    resolve: Resolver,
    networks: Sequence[Network] = (),
) -> str | None:
    """Why the hub will not POST to ``url``, or None: a caller's URL
    (``reach.core.notify.outbound.url_refusal``) judged by `rule_of`: public addresses,
    the operator's ``networks``, and with ``allow_private`` loopback and private ones too;
    link-local never. A name that does not resolve raises ``OSError``."""
    setting = "" if allow_private else " (callbacks.allow_private is off)"
    rule = rule_of(allow_private, networks)
    return _url_refusal(url, resolve, rule, caller_chosen=True, setting=setting)


def rule_of(allow_private: bool, networks: Sequence[Network] = ()) -> NetworkRule:
    """The addresses callbacks may go to (`reach.core.security.networks`)."""
    return NetworkRule(loopback=allow_private, private=allow_private, networks=tuple(networks))


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
