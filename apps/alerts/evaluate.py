"""Evaluating the alert rules: the scheduler loop's upkeep calls `upkeep()`, which evaluates every
rule at most every `PORTAL_ALERTS_EVERY_S` and sends what is due (apps/alerts/delivery.py).

The figures are the database's, the same /metrics gives (apps/monitoring/metrics.py):

- queue_wait: how long the oldest queued job or instance of a workspace (of the rule's GPU type,
  if it names one) has waited, in seconds; one alert per workspace.
- quota_used: GPUs held by a workspace's jobs and instances (the sum of their allocations'
  fractions), as a percentage of its nominal quota of a GPU type; one alert per workspace and
  GPU type. A quota of 0 GPUs is not judged.
- node_unhealthy: each node whose state is not "ready" (nor powered down, starting or stopping as an
  elastic pool's autoscaler asked); one alert per node.
- backend_failing: workloads that failed (audit events job.failed, instance.fail, notebook.fail)
  in the last `window_s` seconds; one alert for the platform.
- gpu_idle: the mean measured utilisation (apps/telemetry: each device's fresh sample) of the GPUs
  a workspace holds, in percent, under the threshold; one alert per workspace and GPU type. Where
  there is no telemetry nothing is measured, and nothing is found: no alert for want of figures.
- reservation_idle: each active GPU reservation (apps/provisioning) its workspace has run nothing on
  for more than the threshold, in seconds (of the rule's GPU type, if it names one); one alert per
  reservation.

An alert is pending from the first evaluation that finds its condition, firing once it has held
for the rule's `for_s`, resolved at the first evaluation that no longer finds it (a pending one
that clears is dropped). A disabled rule finds nothing, so its alerts resolve.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Min, Q, Sum
from django.utils import timezone

from apps.alerts import delivery
from apps.alerts.models import Alert, AlertRule
from apps.audit.actions import do_log_event
from apps.audit.events import Event
from apps.audit.models import AuditEvent
from apps.inventory.models import Allocation, Node
from apps.provisioning.models import ProvisioningRequest
from apps.telemetry.models import GpuSample
from apps.telemetry.record import FRESH_S, RAW
from apps.workloads.kinds import scheduled
from apps.workloads.models import Workload
from apps.workspaces.models import GPUQuota, Workspace

logger = logging.getLogger(__name__)

FAILURES = (Event.JOB_FAILED, Event.INSTANCE_FAIL, Event.NOTEBOOK_FAIL)
_last_run = 0.0


@dataclass(frozen=True)
class Found:
    """One thing a rule's condition holds for."""

    labels: dict[str, str]
    value: Decimal | None
    workspace_id: int | None = None


def upkeep() -> dict[str, int]:
    """`evaluate()`, at most every `PORTAL_ALERTS_EVERY_S`; it never raises."""
    global _last_run
    if time.monotonic() - _last_run < settings.PORTAL_ALERTS_EVERY_S:
        return {}
    _last_run = time.monotonic()
    try:
        return evaluate()
    except Exception:  # alerts never stop the scheduler loop
        logger.exception("could not evaluate the alert rules")
        return {}


def evaluate(now: datetime | None = None, rules: list[AlertRule] | None = None) -> dict[str, int]:
    """Evaluate the rules (all of them unless told), then deliver what is due."""
    now = now or timezone.now()
    counts = {"alerts_firing": 0, "alerts_resolved": 0, "alerts_delivered": 0, "alerts_delivery_failed": 0}
    rows = rules if rules is not None else list(AlertRule.objects.select_related("workspace"))
    for rule in rows:
        try:
            _evaluate_rule(rule, now, counts)
        except Exception:  # one rule never stops the others
            logger.exception("could not evaluate alert rule %s", rule.pk)
    due = Alert.objects.filter(
        Q(state=Alert.State.FIRING) | Q(state=Alert.State.RESOLVED, resolved_at__gte=now - delivery.RESOLVED_NOTICE)
    )
    if rules is not None:
        due = due.filter(rule__in=[r.pk for r in rules])
    for alert in due.select_related("rule__workspace", "workspace"):
        try:
            delivered, failed = delivery.deliver(alert, now)
        except Exception:
            logger.exception("could not deliver alert %s", alert.pk)
            continue
        counts["alerts_delivered"] += delivered
        counts["alerts_delivery_failed"] += failed
    return counts


def conditions(rule: AlertRule, now: datetime) -> dict[str, Found]:
    """What the rule's condition holds for now, by key."""
    kind = AlertRule.Kind
    if rule.kind == kind.QUEUE_WAIT:
        return _queue_wait(rule, now)
    if rule.kind == kind.QUOTA_USED:
        return _quota_used(rule)
    if rule.kind == kind.NODE_UNHEALTHY:
        return _node_unhealthy(rule)
    if rule.kind == kind.BACKEND_FAILING:
        return _backend_failing(rule, now)
    if rule.kind == kind.GPU_IDLE:
        return _gpu_idle(rule, now)
    if rule.kind == kind.RESERVATION_IDLE:
        return _reservation_idle(rule, now)
    return {}


def _reservation_idle(rule: AlertRule, now: datetime) -> dict[str, Found]:
    idle = ProvisioningRequest.objects.filter(
        state=ProvisioningRequest.State.ACTIVE, idle_since__isnull=False
    ).select_related("workspace")
    if rule.workspace_id is not None:
        idle = idle.filter(workspace_id=rule.workspace_id)
    if rule.gpu_type:
        idle = idle.filter(gpu_type=rule.gpu_type)
    found = {}
    for gpr in idle.order_by("pk"):
        assert gpr.idle_since is not None
        seconds = Decimal(max(0.0, (now - gpr.idle_since).total_seconds())).quantize(Decimal("0.01"))
        if seconds > rule.threshold:
            labels = {"workspace": gpr.workspace.name, "gpu_type": gpr.gpu_type, "gpr": str(gpr.pk),
                      "gpus": str(gpr.gpus)}  # fmt: skip
            found[f"gpr={gpr.pk}"] = Found(labels, seconds, gpr.workspace_id)
    return found


def _gpu_idle(rule: AlertRule, now: datetime) -> dict[str, Found]:
    fresh = GpuSample.objects.filter(
        resolution_s=RAW, at__gte=now - timedelta(seconds=FRESH_S), workspace_id__isnull=False
    )
    if rule.workspace_id is not None:
        fresh = fresh.filter(workspace_id=rule.workspace_id)
    if rule.gpu_type:
        fresh = fresh.filter(gpu__gpu_type=rule.gpu_type)
    newest: dict[int, tuple[int, str, str, float]] = {}
    rows = fresh.order_by("gpu_id", "-at").values_list(
        "gpu_id", "workspace_id", "workspace__name", "gpu__gpu_type", "utilisation"
    )
    for gpu_id, workspace_id, name, gpu_type, utilisation in rows:
        newest.setdefault(gpu_id, (workspace_id, name, gpu_type, utilisation))
    by_holder: dict[tuple[int, str, str], list[float]] = {}
    for workspace_id, name, gpu_type, utilisation in newest.values():
        by_holder.setdefault((workspace_id, name, gpu_type), []).append(utilisation)
    found = {}
    for (workspace_id, name, gpu_type), values in sorted(by_holder.items()):
        mean = Decimal(sum(values) / len(values)).quantize(Decimal("0.01"))
        if mean < rule.threshold:
            labels = {"workspace": name, "gpu_type": gpu_type, "gpus_measured": str(len(values))}
            found[f"workspace={name},gpu_type={gpu_type}"] = Found(labels, mean, workspace_id)
    return found


def _queue_wait(rule: AlertRule, now: datetime) -> dict[str, Found]:
    first: dict[int, datetime] = {}
    for kind, traits in scheduled().items():
        rows = Workload.objects.filter(kind=kind, state=traits.queued)
        if rule.workspace_id is not None:
            rows = rows.filter(workspace_id=rule.workspace_id)
        if rule.gpu_type:
            rows = rows.filter(podsets__gpu_type=rule.gpu_type).distinct()
        for workspace_id, since in rows.values_list("workspace_id").annotate(since=Min("created_at")).order_by():
            first[workspace_id] = min(first.get(workspace_id, since), since)
    names = dict(Workspace.objects.filter(pk__in=first).values_list("pk", "name"))
    found = {}
    for workspace_id, since in first.items():
        waited = Decimal(max(0.0, (now - since).total_seconds())).quantize(Decimal("0.01"))
        if waited > rule.threshold:
            labels = {"workspace": names[workspace_id]}
            if rule.gpu_type:  # a rule over every GPU type has no such label, rather than an empty one
                labels["gpu_type"] = rule.gpu_type
            found[f"workspace={names[workspace_id]}"] = Found(labels, waited, workspace_id)
    return found


def _quota_used(rule: AlertRule) -> dict[str, Found]:
    quotas = GPUQuota.objects.filter(gpus__gt=0)
    if rule.workspace_id is not None:
        quotas = quotas.filter(workspace_id=rule.workspace_id)
    if rule.gpu_type:
        quotas = quotas.filter(gpu_type=rule.gpu_type)
    rows = list(quotas.values_list("workspace_id", "workspace__name", "gpu_type", "gpus"))
    held = dict(
        ((workspace_id, gpu_type), total)
        for workspace_id, gpu_type, total in Allocation.objects.filter(
            workload__workspace_id__in={row[0] for row in rows}
        )
        .values_list("workload__workspace_id", "gpu__gpu_type")
        .annotate(n=Sum("fraction"))
        .order_by()
    )
    found = {}
    for workspace_id, name, gpu_type, gpus in rows:
        used = Decimal(held.get((workspace_id, gpu_type)) or 0)
        percent = (used * 100 / gpus).quantize(Decimal("0.01"))
        if percent >= rule.threshold:
            labels = {"workspace": name, "gpu_type": gpu_type, "gpus_allocated": f"{used.normalize():f}",
                      "quota_gpus": f"{gpus.normalize():f}"}  # fmt: skip
            found[f"workspace={name},gpu_type={gpu_type}"] = Found(labels, percent, workspace_id)
    return found


def _node_unhealthy(rule: AlertRule) -> dict[str, Found]:
    # An elastic pool's nodes stopped, starting or stopping as the autoscaler asked are not unhealthy
    # (one that failed to start is).
    expected = (Node.State.READY, Node.State.POWERED_DOWN, Node.State.POWERING_UP, Node.State.POWERING_DOWN)
    nodes = Node.objects.exclude(state__in=expected)
    if rule.gpu_type:
        nodes = nodes.filter(gpus__gpu_type=rule.gpu_type).distinct()
    rows = nodes.values_list("pool__cluster__name", "name", "state")
    return {
        f"cluster={cluster},node={name}": Found({"cluster": cluster, "node": name, "state": state}, None)
        for cluster, name, state in rows
    }


def _backend_failing(rule: AlertRule, now: datetime) -> dict[str, Found]:
    since = now - timedelta(seconds=rule.window_s)
    failed = AuditEvent.objects.filter(action__in=[e.value for e in FAILURES], created_at__gte=since).count()
    if failed < max(rule.threshold, Decimal(1)):
        return {}
    return {"platform": Found({"window_s": str(rule.window_s)}, Decimal(failed))}


def _evaluate_rule(rule: AlertRule, now: datetime, counts: dict[str, int]) -> None:
    found = conditions(rule, now) if rule.enabled else {}
    with transaction.atomic():
        # One evaluator at a time per rule: another process evaluating it meanwhile skips it.
        if not AlertRule.objects.select_for_update(skip_locked=True).filter(pk=rule.pk).exists():
            return
        existing = {alert.key: alert for alert in Alert.objects.filter(rule=rule)}
        for key, what in found.items():
            alert = existing.get(key)
            if alert is None:
                alert = Alert(rule=rule, key=key, pending_since=now)
            elif alert.state == Alert.State.RESOLVED:  # a new episode
                alert.state, alert.pending_since = Alert.State.PENDING, now
                alert.firing_since = alert.resolved_at = alert.notified_at = None
                alert.delivered = {}
            alert.labels, alert.value, alert.workspace_id = what.labels, what.value, what.workspace_id
            alert.last_seen_at = now
            fires = alert.state == Alert.State.PENDING and (now - alert.pending_since).total_seconds() >= rule.for_s
            if fires:
                alert.state, alert.firing_since = Alert.State.FIRING, now
            alert.save()
            if fires:
                counts["alerts_firing"] += 1
                _log(Event.ALERT_FIRE, alert, rule)
        for key, alert in existing.items():
            if key in found:
                continue
            if alert.state == Alert.State.PENDING:
                alert.delete()
            elif alert.state == Alert.State.FIRING:
                alert.state, alert.resolved_at = Alert.State.RESOLVED, now
                alert.save(update_fields=["state", "resolved_at"])
                counts["alerts_resolved"] += 1
                _log(Event.ALERT_RESOLVE, alert, rule)


def _log(event: Event, alert: Alert, rule: AlertRule) -> None:
    data: dict[str, Any] = {"rule": rule.name, "labels": alert.labels}
    if alert.value is not None:
        data["value"] = str(alert.value)
    do_log_event(event, alert, workspace=rule.workspace, data=data)
