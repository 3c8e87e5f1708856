"""Building blocks the scheduling tests share: workspaces with an h100 quota, and reading decisions."""

from __future__ import annotations

from decimal import Decimal as D

from apps.scheduling.engine import Decisions, Quota, WorkspaceInfo


def ws(
    name: str,
    h100: str | None = None,
    *,
    borrowing_limit: str | None = None,
    lending_limit: str | None = None,
    cohort: str | None = None,
    can_borrow: bool = False,
    weight: float = 1.0,
    history: float = 0.0,
) -> WorkspaceInfo:
    quotas = ()
    if h100 is not None:
        quotas = (
            Quota(
                "h100",
                D(h100),
                None if borrowing_limit is None else D(borrowing_limit),
                None if lending_limit is None else D(lending_limit),
            ),
        )
    past = (("h100", history),) if history else ()
    return WorkspaceInfo(name, quotas, cohort, can_borrow, weight, past)


def admitted(decisions: Decisions) -> list[str]:
    return [a.key for a in decisions.admitted]


def reasons(decisions: Decisions) -> dict[str, str]:
    return {p.key: p.reason for p in decisions.pending}
