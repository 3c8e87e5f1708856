"""Past GPU use written as the run records the portal keeps (jobs and their attempts, instances,
notebooks), and the GPU-seconds they stand for computed in plain Python, independently of the
report's SQL."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal, localcontext
from itertools import count
from typing import Any

from apps.compute.models import Instance, Notebook
from apps.jobs.models import Job, JobAttempt
from apps.workspaces.models import Workspace
from tests.personas import World

_names = count()
Cell = tuple[str, str, str | None, str]  # month, workspace, user, GPU type


@dataclass(frozen=True)
class Run:
    """One interval of GPU use as the records give it: `ended` None while it runs."""

    workspace: str
    user: str | None
    gpu_type: str
    gpus: Decimal
    began: datetime
    ended: datetime | None


def job(
    workspace: Workspace,
    user: Any,
    attempts: Iterable[tuple[datetime, datetime | None]],
    *,
    gpu_type: str = "h100",
    gpus: Decimal = Decimal("1"),
    replicas: int = 1,
) -> Job:
    """A job with these attempts (start, end or None while it runs), in the state they imply."""
    spans = list(attempts)
    running = bool(spans) and spans[-1][1] is None
    made = Job.objects.create(
        workspace=workspace,
        name=f"job-{next(_names)}",
        created_by=user,
        gpu_type=gpu_type,
        gpus_per_replica=gpus,
        replicas=replicas,
        state=Job.State.RUNNING if running else Job.State.SUCCEEDED if spans else Job.State.QUEUED,
        attempts=len(spans),
        started_at=spans[-1][0] if running else None,
        finished_at=spans[-1][1] if spans and not running else None,
    )
    JobAttempt.objects.bulk_create(
        JobAttempt(job=made, number=n, started_at=began, finished_at=ended, outcome="" if ended is None else "done")
        for n, (began, ended) in enumerate(spans, start=1)
    )
    return made


def instance(
    world: World,
    workspace: Workspace,
    user: Any,
    began: datetime | None,
    ended: datetime | None,
    *,
    gpu_type: str = "h100",
    gpus: Decimal = Decimal("1"),
    notebooks: int = 0,
) -> Instance:
    """An instance that ran from `began` (None: never started) to `ended` (None: still running),
    with `notebooks` notebooks that ran on it all along."""
    live = began is not None and ended is None
    made = Instance.objects.create(
        workspace=workspace,
        name=f"box-{next(_names)}",
        profile=world.gpu_1,
        created_by=user,
        gpu_type=gpu_type,
        gpus_per_replica=gpus,
        state=Instance.State.RUNNING if live else Instance.State.DELETED if began else Instance.State.QUEUED,
        admitted_at=began,
        started_at=began,
        finished_at=ended,
    )
    for _ in range(notebooks):
        Notebook.objects.create(
            workspace=workspace,
            instance=made,
            name=f"nb-{next(_names)}",
            profile=world.minimal,
            created_by=user,
            state=Notebook.State.READY if live else Notebook.State.STOPPED,
            started_at=began,
            stopped_at=ended,
        )
    return made


def month_start(moment: datetime) -> datetime:
    return datetime(moment.year, moment.month, 1, tzinfo=UTC)


def next_month(moment: datetime) -> datetime:
    start = month_start(moment)
    return start.replace(year=start.year + 1, month=1) if start.month == 12 else start.replace(month=start.month + 1)


def pieces(began: datetime, ended: datetime) -> Iterator[tuple[str, timedelta]]:
    """[began, ended) cut at the start of each month: (YYYY-MM, length) for each piece."""
    moment = began
    while moment < ended:
        cut = min(ended, next_month(moment))
        yield f"{moment.year:04d}-{moment.month:02d}", cut - moment
        moment = cut


def seconds(span: timedelta) -> Decimal:
    """A length in seconds, exactly (to the microsecond)."""
    return Decimal(span // timedelta(microseconds=1)) / Decimal(1_000_000)


def expected_cells(runs: Iterable[Run], now: datetime) -> dict[Cell, Decimal]:
    """GPU-seconds per (month, workspace, user, GPU type): each run up to its end or `now`."""
    cells: dict[Cell, Decimal] = defaultdict(Decimal)
    with localcontext() as exact:
        exact.prec = 60
        for run in runs:
            if run.gpus <= 0:
                continue
            for month, span in pieces(run.began, run.ended or now):
                cells[(month, run.workspace, run.user, run.gpu_type)] += run.gpus * seconds(span)
    return {cell: total for cell, total in cells.items() if total}


def hours(gpu_seconds: Decimal) -> Decimal:
    with localcontext() as exact:
        exact.prec = 60
        return (gpu_seconds / Decimal(3600)).quantize(Decimal("0.000001"), rounding=ROUND_HALF_UP)
