"""How the SDK turns a task that ended at the approval gate into the caller's error."""

from __future__ import annotations

from typing import Any

import pytest

import reach
from reach.sdk.caller import outcome, result_timeout


def _view(status: str, error: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"task_id": "t-1", "status": status, "attempt_seq": 0, "error": error}


def test_a_rejected_task_raises_approval_rejected_with_who_and_why() -> None:
    error = {
        "kind": "approval_rejected",
        "approval_id": "ap-1",
        "decided_by": "key:approverkey01",
        "decided_name": "alice",
        "reason": "not during the sale",
        "message": "approval ap-1 was rejected by alice: not during the sale",
    }
    with pytest.raises(reach.ApprovalRejected) as caught:
        outcome(_view("failed", error))
    assert caught.value.extra == {
        "task_id": "t-1",
        "approval_id": "ap-1",
        "decided_by": "key:approverkey01",
        "decided_name": "alice",
        "reason": "not during the sale",
    }
    assert "not during the sale" in str(caught.value)
    assert not isinstance(caught.value, reach.BusinessError)


def test_a_rejection_without_a_message_still_names_who_and_why() -> None:
    error = {"kind": "approval_rejected", "decided_by": "key:k1", "reason": "no"}
    with pytest.raises(reach.ApprovalRejected, match=r"rejected by key:k1: no"):
        outcome(_view("failed", error))


def test_an_expired_task_raises_approval_expired() -> None:
    error = {
        "kind": "approval_expired",
        "approval_id": "ap-1",
        "expires_at": 5.0,
        "message": "approval ap-1 expired: nobody decided within its time",
    }
    with pytest.raises(reach.ApprovalExpired, match="nobody decided") as caught:
        outcome(_view("failed", error))
    assert caught.value.extra == {"task_id": "t-1", "approval_id": "ap-1", "expires_at": 5.0}


def test_other_failures_stay_business_errors() -> None:
    with pytest.raises(reach.BusinessError) as caught:
        outcome(_view("failed", {"code": 7, "message": "out of stock"}))
    assert caught.value.code == 7


def test_a_wait_that_runs_out_while_parked_says_it_awaits_approval() -> None:
    exc = result_timeout(_view("awaiting_approval"), "t-1", 2.0)
    assert isinstance(exc, reach.ResultTimeout)
    assert "still awaiting approval after 2s" in str(exc)
    assert exc.extra == {"task_id": "t-1", "status": "awaiting_approval"}


def test_a_plain_timeout_names_the_status() -> None:
    exc = result_timeout(_view("executing"), "t-1", 2.0)
    assert str(exc) == "task t-1 is still executing after 2s"
    assert exc.extra["status"] == "executing"
