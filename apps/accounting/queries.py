"""GPU-hours per workspace, user, GPU type and calendar month (UTC), read from the workloads' own
run records; nothing is sampled and nothing else is stored.

What counts (docs/operations.md, "Usage accounting"):

- a job's attempt (``JobAttempt``) from its ``started_at`` to its ``finished_at``, with the job's
  ``gpus_per_replica × replicas``; an attempt not yet finished counts up to ``now``;
- an instance from its ``started_at`` to its ``finished_at`` (or ``now``), with its
  ``gpus_per_replica × replicas``;
- notebooks never: they run on their instance's GPUs, which the instance already counts.

Each interval is cut at the first instant of every calendar month it spans, in UTC, and its
pieces are summed per (month, workspace, user, GPU type) in one SQL query. GPU-seconds are exact
(GPU counts have three decimal places, times one microsecond); GPU-hours are GPU-seconds / 3600,
rounded half up to six decimal places.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal, localcontext
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connection
from django.db.models import Case, F, FloatField, Sum, Value, When
from django.db.models.functions import TruncMonth
from django.utils import timezone

from apps.jobs.models import JobAttempt
from apps.workloads.models import PodSet, Workload
from apps.workspaces.access import MANAGE, restrict
from apps.workspaces.models import Workspace

# What a report may be grouped by, besides the month (always).
GROUPS = ("workspace", "user", "gpu_type")
HOURS_PLACES = Decimal("0.000001")
SECONDS_PLACES = Decimal("0.000000001")  # three decimals of a GPU times a microsecond: exact
MONTH_PATTERN = r"^[1-9][0-9]{3}-(0[1-9]|1[0-2])$"
_MONTH = re.compile(MONTH_PATTERN)


@dataclass(frozen=True, order=True)
class Month:
    """A calendar month in UTC."""

    year: int
    month: int

    @classmethod
    def parse(cls, text: str) -> Month:
        """Month(2026, 11) from "2026-11"; ValueError for anything else (years 1000 to 9999)."""
        if not _MONTH.match(text):
            raise ValueError("Give a month as YYYY-MM, such as 2026-11.")
        year, month = text.split("-")
        return cls(int(year), int(month))

    @classmethod
    def of(cls, moment: datetime) -> Month:
        moment = moment.astimezone(UTC)
        return cls(moment.year, moment.month)

    @property
    def start(self) -> datetime:
        return datetime(self.year, self.month, 1, tzinfo=UTC)

    @property
    def label(self) -> str:
        return f"{self.year:04d}-{self.month:02d}"

    def shifted(self, months: int) -> Month:
        """The month `months` later (earlier, if negative)."""
        index = self.year * 12 + self.month - 1 + months
        return Month(index // 12, index % 12 + 1)

    def __str__(self) -> str:
        return self.label


@dataclass(frozen=True)
class UsageRow:
    """GPU use of one cell of a report. A field the report is not grouped by is None; so is
    `user` for work whose creator's account was deleted."""

    month: str
    workspace: str | None
    user: str | None
    gpu_type: str | None
    gpu_seconds: Decimal
    # GPU-seconds of measured use (utilisation x time, apps/telemetry); None without telemetry.
    measured_seconds: Decimal | None = None

    @property
    def gpu_hours(self) -> Decimal:
        return gpu_hours(self.gpu_seconds)

    @property
    def measured_gpu_hours(self) -> Decimal | None:
        return gpu_hours(self.measured_seconds) if self.measured_seconds is not None else None

    def as_dict(self) -> dict[str, Any]:
        return {
            "month": self.month,
            "workspace": self.workspace,
            "user": self.user,
            "gpu_type": self.gpu_type,
            "gpu_hours": self.gpu_hours,
            "gpu_seconds": self.gpu_seconds.quantize(SECONDS_PLACES),
            "measured_gpu_hours": self.measured_gpu_hours,
        }


@dataclass
class UsageReport:
    """A report's rows and what they were computed for: `as_of` is the "now" up to which
    running work counts."""

    as_of: datetime
    month: Month | None
    workspace: str | None
    group_by: tuple[str, ...]
    rows: list[UsageRow] = field(default_factory=list)


def gpu_hours(gpu_seconds: Decimal) -> Decimal:
    """GPU-seconds as GPU-hours, rounded half up to six decimal places."""
    with localcontext() as exact:
        exact.prec = 60
        return (gpu_seconds / 3600).quantize(HOURS_PLACES, rounding=ROUND_HALF_UP)


def owned_workspace_ids(user: Any) -> list[int] | None:
    """The workspaces whose usage `user` may see: None for every one (a platform admin), else
    the ids of those they own (none, for anyone else)."""
    if getattr(user, "is_staff", False) and getattr(user, "workspace_scope", None) is None:
        return None
    return list(restrict(Workspace.objects.all(), user, MANAGE).values_list("pk", flat=True))


def usage_report(
    user: Any,
    *,
    month: Month | None = None,
    workspace: str | None = None,
    group_by: Sequence[str] = GROUPS,
    now: datetime | None = None,
) -> UsageReport:
    """The usage `user` may see (owned_workspace_ids), in `month` (every month if None) and
    `workspace` (by name; every visible one if None), grouped by month and `group_by`. Another
    tenant's workspace, or one that does not exist, gives no rows. Two queries at most."""
    now = now or timezone.now()
    visible = owned_workspace_ids(user)
    cells = [] if visible == [] else usage_cells(workspace_ids=visible, workspace=workspace, month=month, now=now)
    if visible != []:
        cells = with_measured(cells, measured_cells(workspace_ids=visible, workspace=workspace, month=month))
    chosen = tuple(name for name in GROUPS if name in group_by)
    return UsageReport(now, month, workspace, chosen, grouped(cells, chosen))


def measured_cells(
    *, workspace_ids: list[int] | None, workspace: str | None, month: Month | None
) -> dict[tuple[str, str, str | None, str], Decimal]:
    """GPU-seconds of measured use per (month, workspace, user, GPU type): each telemetry sample's
    utilisation times the time it stands for (the sampling period, or its folded bucket), over the
    samples of devices a workspace's work held. Empty where there is no telemetry."""
    from apps.telemetry.models import GpuSample  # what was measured, beside what was held
    from apps.telemetry.record import RAW

    rows = GpuSample.objects.filter(workspace__isnull=False)
    if workspace_ids is not None:
        rows = rows.filter(workspace_id__in=workspace_ids)
    if workspace is not None:
        rows = rows.filter(workspace__name=workspace)
    if month is not None:
        rows = rows.filter(at__gte=month.start, at__lt=_end_of(month))
    period = Case(
        When(resolution_s=RAW, then=Value(float(settings.PORTAL_TELEMETRY_EVERY_S))),
        default=F("resolution_s"),
        output_field=FloatField(),
    )
    cells = (
        rows.annotate(
            month=TruncMonth("at", tzinfo=UTC),
            user=F("workload__created_by__username"),
        )
        .values_list("month", "workspace__name", "user", "gpu__gpu_type")
        .annotate(busy=Sum(F("utilisation") * period / 100, output_field=FloatField()))
        .order_by()
    )
    return {(Month.of(at).label, name, user, gpu_type): Decimal(str(busy)) for at, name, user, gpu_type, busy in cells}


def with_measured(cells: list[UsageRow], measured: dict[tuple[str, str, str | None, str], Decimal]) -> list[UsageRow]:
    """The cells with their measured use; a cell measured but not held (its work's run records
    gone) is kept, with 0 held."""
    if not measured:
        return cells
    out = []
    for cell in cells:
        key = (cell.month, cell.workspace or "", cell.user, cell.gpu_type or "")
        out.append(replace(cell, measured_seconds=measured.pop(key, Decimal(0))))
    out += [UsageRow(*key, gpu_seconds=Decimal(0), measured_seconds=busy) for key, busy in measured.items()]
    return out


def grouped(cells: Iterable[UsageRow], group_by: Sequence[str]) -> list[UsageRow]:
    """Cells summed per month and the fields of `group_by`; the others become None."""
    sums: dict[tuple[str, str | None, str | None, str | None], Decimal] = {}
    measured: dict[tuple[str, str | None, str | None, str | None], Decimal] = {}
    with localcontext() as exact:
        exact.prec = 60
        for cell in cells:
            key = (
                cell.month,
                cell.workspace if "workspace" in group_by else None,
                cell.user if "user" in group_by else None,
                cell.gpu_type if "gpu_type" in group_by else None,
            )
            sums[key] = sums.get(key, Decimal(0)) + cell.gpu_seconds
            if cell.measured_seconds is not None:
                measured[key] = measured.get(key, Decimal(0)) + cell.measured_seconds
    rows = [UsageRow(*key, gpu_seconds=total, measured_seconds=measured.get(key)) for key, total in sums.items()]
    return sorted(rows, key=lambda r: (r.month, r.workspace or "", r.user or "", r.gpu_type or ""))


def usage_cells(
    *,
    workspace_ids: list[int] | None,
    workspace: str | None,
    month: Month | None,
    now: datetime,
    portable: bool | None = None,
) -> list[UsageRow]:
    """GPU-seconds per (month, workspace, user, GPU type), in one query: jobs' attempts and
    instances, cut at month boundaries (UTC), limited to the workspaces of `workspace_ids` (all if
    None), the one named `workspace` (if given) and `month` (if given). On PostgreSQL the database
    cuts and sums; elsewhere (the embedded default's SQLite), or with `portable`, the same is done
    here over the runs' rows, to the same microsecond."""
    if portable if portable is not None else connection.vendor != "postgresql":
        return _cells_here(workspace_ids=workspace_ids, workspace=workspace, month=month, now=now)
    params: dict[str, Any] = {"now": now}
    narrow = ""
    if workspace_ids is not None:
        narrow += " AND {alias}.workspace_id = ANY(%(workspace_ids)s)"
        params["workspace_ids"] = workspace_ids
    if workspace is not None:
        narrow += f" AND {{alias}}.workspace_id IN (SELECT id FROM {_table(Workspace)} WHERE name = %(workspace)s)"
        params["workspace"] = workspace
    since = until = "NULL"
    if month is not None:
        # Only what overlaps the month, and only its part within it. Its end is computed by the
        # database, which has a year 10000 (after 9999-12).
        params["since"] = month.start
        since, until = "%(since)s", "((%(since)s AT TIME ZONE 'UTC') + INTERVAL '1 month') AT TIME ZONE 'UTC'"
        narrow += f" AND {{began}} < {until} AND ({{ended}} IS NULL OR {{ended}} > %(since)s)"
    sql = _SQL.format(
        attempt=_table(JobAttempt),
        workload=_table(Workload),
        podset=_table(PodSet),
        workspace=_table(Workspace),
        user=_table(get_user_model()),
        job_narrow=narrow.format(alias="j", began="a.started_at", ended="a.finished_at"),
        instance_narrow=narrow.format(alias="i", began="i.started_at", ended="i.finished_at"),
        since=since,
        until=until,
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return [UsageRow(*row) for row in cursor.fetchall()]


def _cells_here(
    *, workspace_ids: list[int] | None, workspace: str | None, month: Month | None, now: datetime
) -> list[UsageRow]:
    """`usage_cells()` over the runs' rows, cut and summed in Python, exactly."""
    runs: list[tuple[str, str | None, str, Decimal, datetime, datetime]] = []
    # A job's attempts with its pod sets; every other kind's run with its pod sets.
    sources = (
        (JobAttempt.objects.all(), "job__", "job__podsets__", "started_at", "finished_at"),
        (
            PodSet.objects.exclude(workload__kind="job"),
            "workload__",
            "",
            "workload__started_at",
            "workload__finished_at",
        ),
    )
    for rows, owner, podset, began, ended in sources:
        rows = rows.filter(**{f"{podset}gpus__gt": 0, f"{began}__isnull": False})
        if workspace_ids is not None:
            rows = rows.filter(**{f"{owner}workspace_id__in": workspace_ids})
        if workspace is not None:
            rows = rows.filter(**{f"{owner}workspace__name": workspace})
        for name, user, gpu_type, gpus, replicas, start, end in rows.values_list(
            f"{owner}workspace__name",
            f"{owner}created_by__username",
            f"{podset}gpu_type",
            f"{podset}gpus",
            f"{podset}replicas",
            began,
            ended,
        ):
            runs.append((name, user, gpu_type, Decimal(gpus) * replicas, start, end or now))
    sums: dict[tuple[str, str | None, str | None, str | None], Decimal] = {}
    with localcontext() as exact:
        exact.prec = 60
        for name, user, gpu_type, gpus, began_at, ended_at in runs:
            if month is not None:
                began_at, ended_at = max(began_at, month.start), min(ended_at, _end_of(month))
            cursor = Month.of(began_at)
            while cursor.start < ended_at:
                piece = min(ended_at, _end_of(cursor)) - max(began_at, cursor.start)
                if piece > timedelta(0):
                    key = (cursor.label, name, user, gpu_type)
                    micro = Decimal(piece // timedelta(microseconds=1))
                    sums[key] = sums.get(key, Decimal(0)) + gpus * micro / 1_000_000
                cursor = cursor.shifted(1)
    rows = [UsageRow(*key, gpu_seconds=total) for key, total in sums.items()]
    return sorted(rows, key=lambda r: (r.month, r.workspace or "", r.user is not None, r.user or "", r.gpu_type or ""))


def _end_of(month: Month) -> datetime:
    """The first instant after the month (the end of time, for 9999-12)."""
    return month.shifted(1).start if (month.year, month.month) < (9999, 12) else datetime.max.replace(tzinfo=UTC)


def _table(model: Any) -> str:
    return connection.ops.quote_name(model._meta.db_table)


# GREATEST and LEAST skip NULLs: without a month, nothing is clipped. A timestamp without time
# zone, read in UTC, steps by calendar month whatever the session's time zone.
_SQL = """
WITH spans AS (
    SELECT j.workspace_id, j.created_by_id AS user_id, p.gpu_type, p.gpus * p.replicas AS gpus,
           a.started_at AS began, COALESCE(a.finished_at, %(now)s) AS ended
    FROM {attempt} a JOIN {workload} j ON j.id = a.job_id JOIN {podset} p ON p.workload_id = j.id
    WHERE p.gpus > 0 AND a.started_at IS NOT NULL{job_narrow}
    UNION ALL
    SELECT i.workspace_id, i.created_by_id, p.gpu_type, p.gpus * p.replicas,
           i.started_at, COALESCE(i.finished_at, %(now)s)
    FROM {workload} i JOIN {podset} p ON p.workload_id = i.id
    WHERE i.kind <> 'job' AND p.gpus > 0 AND i.started_at IS NOT NULL{instance_narrow}
), clipped AS (
    SELECT workspace_id, user_id, gpu_type, gpus,
           GREATEST(began, {since}) AS began, LEAST(ended, {until}) AS ended
    FROM spans
), pieces AS (
    SELECT c.workspace_id, c.user_id, c.gpu_type, c.gpus, m.month,
           GREATEST(c.began, m.month AT TIME ZONE 'UTC') AS began,
           LEAST(c.ended, (m.month + INTERVAL '1 month') AT TIME ZONE 'UTC') AS ended
    FROM clipped c
    CROSS JOIN LATERAL generate_series(
        date_trunc('month', c.began AT TIME ZONE 'UTC'),
        date_trunc('month', c.ended AT TIME ZONE 'UTC'),
        INTERVAL '1 month'
    ) AS m(month)
    WHERE c.ended > c.began
)
SELECT to_char(p.month, 'YYYY-MM'), w.name, u.username, p.gpu_type,
       SUM(p.gpus * (EXTRACT(EPOCH FROM p.ended) - EXTRACT(EPOCH FROM p.began)))
FROM pieces p
JOIN {workspace} w ON w.id = p.workspace_id
LEFT JOIN {user} u ON u.id = p.user_id
WHERE p.ended > p.began
GROUP BY p.month, w.name, u.username, p.gpu_type
ORDER BY p.month, w.name, u.username NULLS FIRST, p.gpu_type
"""
