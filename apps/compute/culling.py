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

An instance is not culled for idleness: without GPU telemetry nothing tells an idle instance
from one used over its kubeconfig or a terminal. Past its workspace's maximum runtime it is
deleted, as a job past its own is stopped, and its page says why.
"""

from __future__ import annotations

import json
import logging
import time
import urllib.error
import urllib.request
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
    for notebook in notebooks.select_related("workspace", "created_by"):
        try:
            _judge(notebook, now, counts)
        except Exception:  # one notebook never stops the others' upkeep
            logger.exception("could not judge whether notebook %s is idle", notebook.pk)
    return counts


def warning_s(limit_s: int) -> int:
    """How long before an idle stop its user is told: `PORTAL_CULL_WARNING_S`, at most half the limit."""
    return min(settings.PORTAL_CULL_WARNING_S, limit_s // 2)


def _judge(notebook: Notebook, now: datetime, counts: dict[str, int]) -> None:
    limit = int(notebook.workspace.max_idle_s or 0)
    since = last_activity(notebook, now)
    if since is None:  # not known: not idle
        return
    idle_s = (now - since).total_seconds()
    if idle_s < limit - warning_s(limit):
        if notebook.idle_warned_at is not None:  # active again: the warning no longer holds
            Notebook.objects.filter(pk=notebook.pk).update(idle_warned_at=None)
        return
    if notebook.idle_warned_at is None:
        _warn(notebook, since, limit, now)
        counts["idle_warned"] += 1
        return
    # Stopped once idle past the limit, and never before its user had the warning's time.
    if idle_s >= limit and now >= notebook.idle_warned_at + timedelta(seconds=warning_s(limit)):
        try:
            do_cull_notebook(notebook, f"culled: idle for {duration(idle_s)}")
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
    busy = GpuSample.objects.filter(instance_id=instance_id, utilisation__gte=threshold)
    return busy.aggregate(last=Max("at"))["last"]


def _ask(url: str, notebook: Notebook) -> list[dict[str, Any]] | None:
    request = urllib.request.Request(url, headers={"Authorization": f"token {notebook.access_token}"})
    try:
        with urllib.request.urlopen(request, timeout=ASK_TIMEOUT_S) as response:
            answer = json.loads(response.read())
    except urllib.error.HTTPError as error:
        if error.code == 404:
            return []
        logger.warning("notebook %s answered %s to %s", notebook.pk, error.code, url)
        return None
    except (OSError, ValueError):
        logger.warning("could not ask notebook %s for its activity", notebook.pk, exc_info=True)
        return None
    return answer if isinstance(answer, list) else None


def _warn(notebook: Notebook, since: datetime, limit: int, now: datetime) -> None:
    """Mail its user that it will be stopped, and remember that they were told."""
    stop_at = max(since + timedelta(seconds=limit), now + timedelta(seconds=warning_s(limit)))
    user = notebook.created_by
    with transaction.atomic():
        if not Notebook.objects.filter(pk=notebook.pk, idle_warned_at__isnull=True).update(idle_warned_at=now):
            return
        do_log_event(
            Event.NOTEBOOK_IDLE_WARNING,
            notebook,
            workspace=notebook.workspace,
            data={"idle_since": since.isoformat(), "stop_at": stop_at.isoformat()},
        )
    if user is None or not user.email:
        return
    page = settings.PORTAL_PUBLIC_URL.rstrip("/") + reverse(
        "web:notebook", kwargs={"ws": notebook.workspace.name, "pk": notebook.pk}
    )
    context = {"notebook": notebook, "user": user, "idle": duration((now - since).total_seconds()), "page": page,
               "in": duration((stop_at - now).total_seconds()), "limit": duration(limit)}  # fmt: skip
    message = EmailMessage(
        subject=f"Notebook {notebook.name} will be stopped in {context['in']}: it is idle",
        body=render_to_string("compute/idle_warning.txt", context),
        to=[user.email],
    )
    try:
        message.send()
    except Exception:  # the stop waits for the warning's time all the same
        logger.warning("could not mail the idle warning of notebook %s", notebook.pk, exc_info=True)


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
