"""What a workspace's limits stop: notebooks idle past `max_idle_s`, and notebooks and instances
running past `max_runtime_s`. The scheduler loop asks every `PORTAL_CULL_EVERY_S` (its upkeep).

A notebook is idle while none of its kernels runs anything and neither a kernel nor a terminal
has done anything since; Jupyter's own API says so (`/api/kernels`, `/api/terminals`: each one's
`last_activity` and `execution_state`), asked with the notebook's token. A kernel that runs a cell
is activity, however quiet the cell; so is, where telemetry exists (apps/telemetry), its
instance's GPUs measured busy. A server that cannot be asked is not judged idle. Its user is
mailed `PORTAL_CULL_WARNING_S` before the stop (at most half the limit); the stop leaves its
files where they are, its page says why ("culled: idle for 2 h 10 min"), and it can be started
again. Activity after the warning cancels it.

An instance is culled for idleness only where GPU telemetry measures it (apps/telemetry): without
it nothing tells an idle instance from one used over its kubeconfig or a terminal. Measured, it is
idle while its GPUs are under `PORTAL_CULL_GPU_BUSY_PERCENT` and none of its notebooks is active;
its user is warned the same way, then it is deleted (its files stay in the workspace), and its
page says why. Past its workspace's maximum runtime it is deleted, as a job past its own is
stopped, and its page says why.
"""

from __future__ import annotations

import json
import logging
import time
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.mail import EmailMessage
from django.db import transaction
from django.db.models import Max
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from apps.audit.actions import do_log_event
from apps.audit.events import Event
from apps.compute.actions import do_cull_instance, do_cull_notebook
from apps.compute.models import Instance, Notebook
from apps.errors import ActionError
from workers.backends.processes import http_get

logger = logging.getLogger(__name__)

ASK_TIMEOUT_S = 5.0
_last_run = 0.0


def upkeep() -> dict[str, int]:
    """`cull()`, at most every `PORTAL_CULL_EVERY_S`."""
    global _last_run
    if time.monotonic() - _last_run < settings.PORTAL_CULL_EVERY_S:
        return {}
    _last_run = time.monotonic()
    return cull()


def cull(now: datetime | None = None) -> dict[str, int]:
    now = now or timezone.now()
    counts = {"idle_warned": 0, "idle_culled": 0, "runtime_culled": 0}
    _past_runtime(now, counts)
    notebooks = Notebook.objects.filter(state=Notebook.State.READY, workspace__max_idle_s__isnull=False)
    for notebook in notebooks.select_related("workspace", "created_by", "instance"):
        try:
            _judge(notebook, last_activity(notebook, now), now, counts)
        except Exception:  # one notebook never stops the others' upkeep
            logger.exception("could not judge whether notebook %s is idle", notebook.pk)
    instances = Instance.objects.filter(state=Instance.State.RUNNING, workspace__max_idle_s__isnull=False)
    for instance in instances.select_related("workspace", "created_by"):
        try:
            _judge(instance, instance_activity(instance, now), now, counts)
        except Exception:
            logger.exception("could not judge whether instance %s is idle", instance.pk)
    return counts


def instance_activity(instance: Instance, now: datetime) -> datetime | None:
    """When an instance was last active: its GPUs measured busy, or one of its notebooks active
    (its start, if never). None, so not idle, where nothing measures its GPUs (no telemetry: it may
    be used over its kubeconfig or a terminal) or a notebook of it cannot be asked."""
    from apps.telemetry.models import GpuSample

    if not GpuSample.objects.filter(workload_id=instance.pk).exists():
        return None
    times = [instance.started_at or now]
    busy = gpu_busy_at(instance.pk)
    if busy is not None:
        times.append(busy)
    for notebook in instance.notebooks.filter(state=Notebook.State.READY).select_related("instance"):
        active = last_activity(notebook, now)
        if active is None:
            return None
        times.append(active)
    return max(times)


def warning_s(limit_s: int) -> int:
    """How long before an idle stop its user is told: `PORTAL_CULL_WARNING_S`, at most half the limit."""
    return min(settings.PORTAL_CULL_WARNING_S, limit_s // 2)


def _judge(row: Notebook | Instance, since: datetime | None, now: datetime, counts: dict[str, int]) -> None:
    limit = int(row.workspace.max_idle_s or 0)
    if since is None:  # not known: not idle
        return
    idle_s = (now - since).total_seconds()
    if idle_s < limit - warning_s(limit):
        if row.idle_warned_at is not None:  # active again: the warning no longer holds
            type(row).objects.filter(pk=row.pk).update(idle_warned_at=None)
        return
    if row.idle_warned_at is None:
        _warn(row, since, limit, now)
        counts["idle_warned"] += 1
        return
    # Stopped once idle past the limit, and never before its user had the warning's time.
    if idle_s >= limit and now >= row.idle_warned_at + timedelta(seconds=warning_s(limit)):
        reason = f"culled: idle for {duration(idle_s)}"
        try:
            do_cull_notebook(row, reason) if isinstance(row, Notebook) else do_cull_instance(row, reason)
        except ActionError:  # stopped meanwhile
            return
        counts["idle_culled"] += 1


def last_activity(notebook: Notebook, now: datetime) -> datetime | None:
    """When the notebook's kernels or terminals last did anything (its start, if never), `now`
    while a kernel runs something, None if its server cannot be asked."""
    base = notebook.proxy_target.rstrip("/")
    if not base:
        return None
    kernels = _ask(f"{base}/api/kernels", notebook)
    if kernels is None:
        return None
    terminals = _ask(f"{base}/api/terminals", notebook) or []  # none where terminals are off
    if any(kernel.get("execution_state") == "busy" for kernel in kernels):
        return now
    times = [notebook.started_at or now]
    for item in [*kernels, *terminals]:
        when = parse_datetime(str(item.get("last_activity") or ""))
        if when is not None:
            times.append(when)
    busy = gpu_busy_at(notebook.instance_id)
    if busy is not None:
        times.append(busy)
    return max(times)


def gpu_busy_at(instance_id: int) -> datetime | None:
    """When the instance's GPUs were last measured busy (apps/telemetry: at least
    `PORTAL_CULL_GPU_BUSY_PERCENT`), if they ever were: work that runs on them (a process started
    from a terminal and left, a job over its kubeconfig) is activity too, where telemetry exists."""
    from apps.telemetry.models import GpuSample  # the telemetry app records what the compute app runs

    threshold = settings.PORTAL_CULL_GPU_BUSY_PERCENT
    busy = GpuSample.objects.filter(workload_id=instance_id, utilisation__gte=threshold)
    return busy.aggregate(last=Max("at"))["last"]


def _ask(url: str, notebook: Notebook) -> list[dict[str, Any]] | None:
    """GET ``url`` of the notebook's server (its route's target: TCP, or a Unix socket) with its token."""
    try:
        status, body = http_get(url, headers={"Authorization": f"token {notebook.access_token}"}, timeout=ASK_TIMEOUT_S)
        if status == 404:
            return []
        if status != 200:
            logger.warning("notebook %s answered %s to %s", notebook.pk, status, url)
            return None
        answer = json.loads(body)
    except (OSError, ValueError):
        logger.warning("could not ask notebook %s for its activity", notebook.pk, exc_info=True)
        return None
    return answer if isinstance(answer, list) else None


def _warn(row: Notebook | Instance, since: datetime, limit: int, now: datetime) -> None:
    """Mail its user that it will be stopped (a notebook) or deleted (an instance), and remember
    that they were told."""
    stop_at = max(since + timedelta(seconds=limit), now + timedelta(seconds=warning_s(limit)))
    notebook = isinstance(row, Notebook)
    user = row.created_by
    with transaction.atomic():
        if not type(row).objects.filter(pk=row.pk, idle_warned_at__isnull=True).update(idle_warned_at=now):
            return
        do_log_event(
            Event.NOTEBOOK_IDLE_WARNING if notebook else Event.INSTANCE_IDLE_WARNING,
            row,
            workspace=row.workspace,
            data={"idle_since": since.isoformat(), "stop_at": stop_at.isoformat()},
        )
    if user is None or not user.email:
        return
    page = settings.PORTAL_PUBLIC_URL.rstrip("/") + reverse(
        "web:notebook" if notebook else "web:instance", kwargs={"ws": row.workspace.name, "pk": row.pk}
    )
    context = {"row": row, "notebook": notebook, "user": user, "idle": duration((now - since).total_seconds()),
               "page": page, "in": duration((stop_at - now).total_seconds()), "limit": duration(limit)}  # fmt: skip
    what = f"Notebook {row.name} will be stopped" if notebook else f"Instance {row.name} will be deleted"
    message = EmailMessage(
        subject=f"{what} in {context['in']}: it is idle",
        body=render_to_string("compute/idle_warning.txt", context),
        to=[user.email],
    )
    try:
        message.send()
    except Exception:  # the stop waits for the warning's time all the same
        logger.warning("could not mail the idle warning of %s %s", type(row).__name__.lower(), row.pk, exc_info=True)


def _past_runtime(now: datetime, counts: dict[str, int]) -> None:
    """Stop the notebooks and delete the instances that run past their workspace's maximum runtime."""
    for model, states in ((Notebook, (Notebook.State.READY,)), (Instance, (Instance.State.RUNNING,))):
        rows = model.objects.filter(
            state__in=states, workspace__max_runtime_s__isnull=False, started_at__isnull=False
        ).select_related("workspace")
        for row in rows:
            limit = int(row.workspace.max_runtime_s or 0)
            ran = (now - row.started_at).total_seconds()
            if ran < limit:
                continue
            reason = (
                f"stopped: ran for {duration(ran)}, past workspace {row.workspace.name}'s limit of {duration(limit)}"
            )
            try:
                if isinstance(row, Notebook):
                    do_cull_notebook(row, reason)
                else:
                    do_cull_instance(row, reason)
            except ActionError:  # stopped meanwhile
                continue
            counts["runtime_culled"] += 1


def duration(seconds: float) -> str:
    """ "2 h 10 min", "45 min", "30 s": as a person says it, to the minute past the first."""
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds} s"
    minutes = seconds // 60
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h" if hours else f"{days} d"
