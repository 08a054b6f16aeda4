"""What an agent key's allow-lists let its agents declare
(`reach.core.security.auth.undeclarable`)."""

from __future__ import annotations

import pytest

from reach.core.security.auth import OPEN, Principal, Scope, undeclarable


def _key(caps: tuple[str, ...] | None, tags: tuple[str, ...] | None) -> Principal:
    return Principal(Scope.AGENT, "k1", "fin-*", "fin", None, caps, tags)


@pytest.mark.parametrize(
    ("principal", "tags", "caps", "expected"),
    [
        (_key(None, None), ["hr"], ["anything"], []),  # no lists: as before
        (_key(("pay*",), ("fin",)), ["fin"], ["pay.card"], []),
        (_key(("pay*",), ("fin",)), ["fin", "hr"], ["pay"], ["tag:hr"]),
        (_key(("pay*",), None), ["hr"], ["refund"], ["capability:refund"]),
        (_key((), ()), ["fin"], ["pay"], ["capability:pay", "tag:fin"]),  # nothing allowed
        (_key(("*",), ("*",)), ["x"], ["y"], []),
        (OPEN, ["hr"], ["refund"], []),  # an admin (and an open hub) declares anything
    ],
)
def test_undeclarable(
    principal: Principal, tags: list[str], caps: list[str], expected: list[str]
) -> None:
    assert undeclarable(principal, tags, caps) == expected
