"""A usage report laid out for the pages: the month asked for, and cross tables with totals."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal, localcontext
from typing import Any, Literal
from urllib.parse import urlencode

from django.urls import reverse
from django.utils import timezone

from apps.accounting.queries import Month, UsageRow, gpu_hours, usage_report

Axis = Literal["workspace", "user"]


@dataclass
class Line:
    """One row of a cross table: (GPU type, GPU-hours) in the table's column order, and the total."""

    name: str | None
    cells: list[tuple[str, Decimal]]
    total: Decimal


@dataclass
class CrossTable:
    """GPU-hours by `axis` (rows) and GPU type (columns), with a total per row, per column and
    in all; each sum is taken over exact GPU-seconds and only then rounded."""

    axis: Axis
    gpu_types: list[str]
    lines: list[Line] = field(default_factory=list)
    totals: list[tuple[str, Decimal]] = field(default_factory=list)
    total: Decimal = Decimal(0)


def cross_table(rows: list[UsageRow], axis: Axis) -> CrossTable:
    """The rows (of one month, grouped by workspace, user and GPU type) as a CrossTable."""
    gpu_types = sorted({row.gpu_type or "" for row in rows})
    names = sorted({getattr(row, axis) for row in rows}, key=lambda name: (name is None, name or ""))
    seconds: dict[tuple[str | None, str], Decimal] = {}
    with localcontext() as exact:
        exact.prec = 60
        for row in rows:
            key = (getattr(row, axis), row.gpu_type or "")
            seconds[key] = seconds.get(key, Decimal(0)) + row.gpu_seconds
        table = CrossTable(axis, gpu_types)
        for name in names:
            per_type = [seconds.get((name, gpu_type), Decimal(0)) for gpu_type in gpu_types]
            cells = [(gpu_type, gpu_hours(s)) for gpu_type, s in zip(gpu_types, per_type, strict=True)]
            table.lines.append(Line(name, cells, gpu_hours(sum(per_type, Decimal(0)))))
        column = [sum((s for (_, t), s in seconds.items() if t == gpu_type), Decimal(0)) for gpu_type in gpu_types]
        table.totals = [(gpu_type, gpu_hours(s)) for gpu_type, s in zip(gpu_types, column, strict=True)]
        table.total = gpu_hours(sum(column, Decimal(0)))
    return table


def chosen_month(text: str | None, now: datetime) -> tuple[Month, list[str]]:
    """The month a page was asked for (YYYY-MM), the current one if none; with an error message,
    and the current month, if the text is not a month."""
    current = Month.of(now)
    if not text:
        return current, []
    try:
        return Month.parse(text), []
    except ValueError as exc:
        return current, [str(exc)]


def month_choices(chosen: Month, now: datetime, count: int = 24) -> list[Month]:
    """The months a page offers, newest first: this one and the `count - 1` before it, and the
    chosen one wherever it is."""
    current = Month.of(now)
    months = {current.shifted(-n) for n in range(count)} | {chosen}
    return sorted(months, reverse=True)


def month_page(user: Any, asked: str | None, *, workspace: str | None = None) -> dict[str, Any]:
    """What a report page of one month shows (the console's, a workspace's): the month asked for
    (this one by default; `errors` says why another was refused), its report as `user` may see
    it, the months to pick from, and the API's CSV of the same rows."""
    now = timezone.now()
    month, errors = chosen_month(asked, now)
    report = usage_report(user, month=month, workspace=workspace, now=now)
    query = {"month": month.label, **({"workspace": workspace} if workspace else {}), "format": "csv"}
    return {
        "report": report,
        "month": month,
        "months": month_choices(month, now),
        "previous": month.shifted(-1),
        "next": month.shifted(1),
        "errors": {"month": errors} if errors else {},
        "csv_url": f"{reverse('usage')}?{urlencode(query)}",
    }
