"""The autoscaler: how many replicas each endpoint should have, and making it so.

Run by the scheduler loop before each cycle (``upkeep``) and by every change of an endpoint
(``converge``). It reads what the portal's proxy recorded of each endpoint's traffic (``Traffic``:
requests being served and waiting, per web process) and decides, between the endpoint's minimum
and maximum:

- **up** when the requests in flight and waiting have needed more replicas than it has
  (``concurrency`` each) for the profile's ``scale_up_after_s``: to as many as they need, one more
  at least; at once when none runs (a cold start: the first request of an endpoint scaled to zero).
  The proxy records the most requests it held at once since its last record, so that a burst
  between two records counts;
- **down** when fewer replicas would have served everything for ``scale_down_after_s``: to what
  is needed, never below the minimum;
- **to zero** when no request came for its ``scale_to_zero_s``.

Each decision is recorded with its reason in words (``ScaleEvent``: "2 → 3 replicas: 14 requests
waiting for 20 s"). Then the replicas are made to match: missing ones are created (queued: the
scheduler admits each under the workspace's quota), surplus ones stopped (those not yet serving
first). A new version rolls out: its replicas start beside the old ones, which stop only once as
many new ones serve. A node's drain replaces the replicas there the same way: each stops once its
replacement, placed on another node, serves (``_retire``). Every period a ``Sample`` of the
endpoint's figures is kept for its page.
"""

from __future__ import annotations

import logging
import math
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from apps.audit.actions import do_log_event
from apps.audit.events import Event
from apps.inference.models import LATENCY_BUCKETS_S, Endpoint, Replica, Sample, ScaleEvent, Traffic
from apps.inference.replicas import do_preempt_replica, live, new_replica, stop_replica

logger = logging.getLogger(__name__)

#: What the proxy recorded longer ago than this is a web process that went away.
FRESH_S = 30.0
#: How often the endpoint's figures are sampled for its page.
SAMPLE_EVERY_S = 10.0
#: Samples older than this are dropped.
KEEP_SAMPLES_S = 7 * 86400
#: Replicas of one version that died after serving, within this window, before the endpoint
#: stops replacing them (a server that crashes under load, again and again).
CRASH_WINDOW_S = 600.0
CRASH_LIMIT = 3

LIVE = (Replica.State.QUEUED, Replica.State.ADMITTED, Replica.State.READY)


class Load:
    """What the proxy saw of one endpoint, all web processes together."""

    def __init__(self, rows: list[Traffic]) -> None:
        self.in_flight = sum(row.in_flight for row in rows)
        self.waiting = sum(row.waiting for row in rows)
        since = [row.waiting_since for row in rows if row.waiting and row.waiting_since is not None]
        self.waiting_since: datetime | None = min(since) if since else None
        self.requests = sum(row.requests for row in rows)
        self.errors = sum(row.errors for row in rows)
        self.tokens = sum(row.completion_tokens for row in rows)
        self.latency_sum = sum(row.latency_sum_s for row in rows)
        self.latency = [0] * len(LATENCY_BUCKETS_S)
        for row in rows:
            for i, count in enumerate(row.latency_counts[: len(self.latency)]):
                self.latency[i] += int(count)


def load_of(endpoint_ids: list[int], now: datetime) -> dict[int, Load]:
    rows: dict[int, list[Traffic]] = {pk: [] for pk in endpoint_ids}
    fresh = Traffic.objects.filter(endpoint_id__in=endpoint_ids, updated_at__gte=now - timedelta(seconds=FRESH_S))
    for row in fresh:
        rows[row.endpoint_id].append(row)
    return {pk: Load(found) for pk, found in rows.items()}


def upkeep(now: datetime | None = None) -> None:
    """Converge every live endpoint (the scheduler loop, before each cycle)."""
    now = now or timezone.now()
    live = list(Endpoint.objects.filter(state__in=Endpoint.LIVE_STATES).values_list("pk", flat=True))
    if not live:
        return
    loads = load_of(live, now)
    for pk in live:
        try:
            converge_one(pk, now, loads[pk])
        except Exception:  # one endpoint's trouble must not stop the others'
            logger.exception("could not converge endpoint %s", pk)
    Sample.objects.filter(at__lt=now - timedelta(seconds=KEEP_SAMPLES_S)).delete()


def converge_one(pk: int, now: datetime | None = None, load: Load | None = None) -> None:
    """Converge one live endpoint now, its row locked (the proxy, for a cold start: the first
    request's replica is asked for at once, not at the loop's next period)."""
    now = now or timezone.now()
    with transaction.atomic():
        endpoint = (
            Endpoint.objects.select_for_update()
            .select_related("workspace", "profile")
            .filter(pk=pk, state__in=Endpoint.LIVE_STATES)
            .first()
        )
        if endpoint is not None:
            converge(endpoint, now, load)


def converge(endpoint: Endpoint, now: datetime, load: Load | None = None) -> None:
    """Decide the endpoint's replicas and make them so (the caller holds its row's lock)."""
    if load is None:
        load = load_of([endpoint.pk], now)[endpoint.pk]
    replicas = list(
        Replica.objects.select_for_update().filter(
            endpoint=endpoint, state__in=(*LIVE, Replica.State.STOPPING, Replica.State.PREEMPTED)
        )
    )
    if endpoint.state == Endpoint.State.DELETING:
        for replica in replicas:
            stop_replica(replica, "the endpoint was deleted")
        if not Replica.objects.filter(endpoint=endpoint).exclude(state__in=Replica.FINAL_STATES).exists():
            endpoint.state = Endpoint.State.DELETED
            endpoint.finished_at = now
            endpoint.save()
            live(endpoint)
        return
    if check_failures(endpoint, now):
        return
    if load.in_flight or load.waiting:
        endpoint.last_request_at = now
    decide(endpoint, now, load)
    # Replicas that make way for a node's drain are not counted: their replacements are made now.
    current = [r for r in replicas if r.version == endpoint.version and r.state in LIVE and r.retiring_at is None]
    older = [r for r in replicas if r.version != endpoint.version and r.state in LIVE]
    # Missing replicas of the current version are made; the first `min_replicas` are its baseline.
    for _ in range(endpoint.desired_replicas - len(current)):
        baseline = sum(1 for r in current if r.baseline) < endpoint.min_replicas
        current.append(new_replica(endpoint, baseline=baseline))
    # Surplus ones stop: those not serving yet first, then the newest.
    surplus = len(current) - endpoint.desired_replicas
    if surplus > 0:
        order = sorted(current, key=lambda r: (r.state == Replica.State.READY, r.baseline, r.pk))
        for replica in order[:surplus]:
            stop_replica(replica, "scaled down")
    # A rollout: the older version's replicas stop once as many of the new one serve.
    serving_new = sum(1 for r in current if r.state == Replica.State.READY)
    if older and serving_new >= min(endpoint.desired_replicas, len(older)):
        for replica in older:
            stop_replica(replica, f"replaced by version {endpoint.version}")
        if endpoint.previous:
            endpoint.previous = None
    _retire(endpoint, [r for r in replicas if r.retiring_at is not None and r.state in LIVE], current, now)
    serving = Replica.objects.filter(endpoint=endpoint, state=Replica.State.READY).exists()
    state = endpoint.state
    if serving:
        state = Endpoint.State.READY
    elif endpoint.desired_replicas == 0:
        state = Endpoint.State.IDLE
    elif state != Endpoint.State.FAILED:
        state = Endpoint.State.DEPLOYING
    if state != endpoint.state:
        endpoint.state = state
        if state == Endpoint.State.READY:
            version = {"version": endpoint.version}
            do_log_event(Event.ENDPOINT_READY, endpoint, workspace=endpoint.workspace, data=version)
        live(endpoint)
    endpoint.save()
    sample(endpoint, now, load)


def _retire(endpoint: Endpoint, retiring: list[Replica], current: list[Replica], now: datetime) -> None:
    """Stop the replicas that make way for a drain (make before break) once their replacements
    serve: as many of the current version serving as the endpoint wants. One not serving yet goes
    at once (nothing is lost); one whose replacement has not served within PORTAL_DRAIN_REPLACE_S
    (no quota or room for it, or its model loads slowly) goes then, so that the drain ends."""
    serving = sum(1 for r in current if r.state == Replica.State.READY)
    for replica in retiring:
        waited = (now - replica.retiring_at).total_seconds() if replica.retiring_at else 0.0
        if replica.state != Replica.State.READY:
            why = "it was not serving yet"
        elif serving >= endpoint.desired_replicas:
            why = "its replacement serves"
        elif waited >= settings.PORTAL_DRAIN_REPLACE_S:
            why = f"no replacement served within {settings.PORTAL_DRAIN_REPLACE_S} s"
        else:
            continue
        do_preempt_replica(replica, reason=f"{replica.retire_reason}; {why}")


def decide(endpoint: Endpoint, now: datetime, load: Load) -> None:
    """Set ``desired_replicas`` from the load, recording a change with its reason."""
    profile = endpoint.profile
    before = endpoint.desired_replicas
    demand = load.in_flight + load.waiting
    needed = math.ceil(demand / profile.concurrency)
    after, reason = before, ""
    quiet_for = (now - endpoint.last_request_at).total_seconds() if endpoint.last_request_at else None
    since_created = (now - endpoint.created_at).total_seconds() if endpoint.created_at else 0.0
    if needed > before and before < endpoint.max_replicas:
        endpoint.pressed_since = endpoint.pressed_since or now
    else:
        endpoint.pressed_since = None
    pressed = (now - endpoint.pressed_since).total_seconds() if endpoint.pressed_since else 0.0
    if before > endpoint.max_replicas:
        after, reason = endpoint.max_replicas, f"the maximum is {endpoint.max_replicas}"
    elif demand and before == 0:
        after = max(1, min(endpoint.max_replicas, max(endpoint.min_replicas, needed)))
        reason = f"{_requests(demand)} waiting and no replica runs"
    elif endpoint.pressed_since is not None and pressed >= profile.scale_up_after_s:
        after = min(endpoint.max_replicas, max(before + 1, needed))
        reason = f"{_requests(demand)} in flight or waiting ({load.waiting} waiting) for {pressed:.0f} s"
    elif (
        endpoint.scale_to_zero_s is not None
        and before > 0
        and demand == 0
        and (quiet_for if quiet_for is not None else since_created) >= endpoint.scale_to_zero_s
    ):
        after, reason = 0, f"no request for {endpoint.scale_to_zero_s} s"
    elif before < endpoint.min_replicas and endpoint.state != Endpoint.State.IDLE:
        after, reason = endpoint.min_replicas, f"the minimum is {endpoint.min_replicas}"
    elif before > max(endpoint.min_replicas, needed):
        endpoint.quiet_since = endpoint.quiet_since or now
        quiet = (now - endpoint.quiet_since).total_seconds()
        if quiet >= profile.scale_down_after_s:
            after = max(endpoint.min_replicas, needed)
            served = f"{after} replica has" if after == 1 else f"{after} replicas have"
            reason = f"{_requests(demand)} in flight: {served} served the load for {quiet:.0f} s"
    if before <= max(endpoint.min_replicas, needed) or after != before:
        endpoint.quiet_since = None
    if after != before:
        endpoint.pressed_since = None
        endpoint.desired_replicas = after
        ScaleEvent.objects.create(endpoint=endpoint, from_replicas=before, to_replicas=after, reason=reason[:500])
        do_log_event(
            Event.ENDPOINT_SCALE, endpoint, workspace=endpoint.workspace,
            data={"from": before, "to": after, "reason": reason},
        )  # fmt: skip


def _requests(count: int) -> str:
    return f"{count} request" + ("" if count == 1 else "s")


def check_failures(endpoint: Endpoint, now: datetime) -> bool:
    """What failed replicas of its current version mean (the caller holds its lock): one that
    never served fails the version: a first deployment fails the endpoint (with the server's own
    words), a rollout goes back to what served before; replicas that served and died are
    replaced, unless ``CRASH_LIMIT`` of them died within ``CRASH_WINDOW_S``. True when the
    endpoint failed."""
    failed = Replica.objects.filter(endpoint=endpoint, version=endpoint.version, state=Replica.State.FAILED)
    unserved = failed.filter(started_at__isnull=True).order_by("-finished_at").first()
    crashed = failed.filter(started_at__isnull=False, finished_at__gte=now - timedelta(seconds=CRASH_WINDOW_S))
    if unserved is not None:
        why = f"replica {unserved.name} did not start: {unserved.reason}"
    elif crashed.count() >= CRASH_LIMIT:
        last = crashed.order_by("-finished_at").first()
        window = f"{CRASH_WINDOW_S:.0f} s"
        why = f"{CRASH_LIMIT} replicas stopped serving within {window}; the last: {last.reason if last else ''}"
    else:
        return False
    previous = endpoint.previous
    if (
        previous
        and Replica.objects.filter(endpoint=endpoint, version=previous["version"], state=Replica.State.READY).exists()
    ):
        version = endpoint.version
        endpoint.version = previous["version"]
        endpoint.model_path = previous["model_path"]
        endpoint.profile_id = previous["profile"]
        endpoint.previous = None
        endpoint.failure_reason = f"version {version} was not rolled out: {why}"[:4000]
        endpoint.save()
        _stop_version(endpoint, version, "its version was not rolled out")
        ScaleEvent.objects.create(
            endpoint=endpoint, from_replicas=endpoint.desired_replicas, to_replicas=endpoint.desired_replicas,
            reason=f"rollout of version {version} abandoned: {why}"[:500],
        )  # fmt: skip
        do_log_event(Event.ENDPOINT_UPDATE, endpoint, workspace=endpoint.workspace,
                     data={"rolled_back_to": endpoint.version, "reason": why[:500]})  # fmt: skip
        live(endpoint, failure_reason=endpoint.failure_reason)
        return False
    endpoint.state = Endpoint.State.FAILED
    endpoint.failure_reason = why[:4000]
    endpoint.finished_at = now
    endpoint.desired_replicas = 0
    endpoint.save()
    for other in Replica.objects.filter(endpoint=endpoint).exclude(state__in=Replica.FINAL_STATES):
        stop_replica(other, "the endpoint failed")
    do_log_event(Event.ENDPOINT_FAILED, endpoint, workspace=endpoint.workspace, data={"reason": why[:500]})
    live(endpoint, failure_reason=endpoint.failure_reason)
    return True


def _stop_version(endpoint: Endpoint, version: int, reason: str) -> None:
    for replica in Replica.objects.filter(endpoint=endpoint, version=version).exclude(state__in=Replica.FINAL_STATES):
        stop_replica(replica, reason)


# -- figures -------------------------------------------------------------------------------------


def sample(endpoint: Endpoint, now: datetime, load: Load) -> None:
    """Keep the endpoint's figures of the last period (at most one sample each SAMPLE_EVERY_S)."""
    last = Sample.objects.filter(endpoint=endpoint).order_by("-at").first()
    if last is not None and (now - last.at).total_seconds() < SAMPLE_EVERY_S:
        return
    counts = Replica.objects.filter(endpoint=endpoint).aggregate(
        replicas=_count(Q(state__in=LIVE)), serving=_count(Q(state=Replica.State.READY))
    )
    totals = {"requests": load.requests, "errors": load.errors, "tokens": load.tokens, "latency": load.latency}
    rates: dict[str, Any] = {
        "requests_per_s": 0.0,
        "errors_per_s": 0.0,
        "tokens_per_s": None,
        "p50_s": None,
        "p95_s": None,
    }
    if last is not None and last.totals:
        elapsed = max(1e-6, (now - last.at).total_seconds())
        previous = last.totals
        delta = {key: max(0, totals[key] - previous.get(key, 0)) for key in ("requests", "errors", "tokens")}
        rates["requests_per_s"] = delta["requests"] / elapsed
        rates["errors_per_s"] = delta["errors"] / elapsed
        rates["tokens_per_s"] = delta["tokens"] / elapsed if delta["tokens"] else None
        buckets = [
            max(0, now_count - then)
            for now_count, then in zip(
                load.latency, previous.get("latency", []) or [0] * len(load.latency), strict=False
            )
        ]
        rates["p50_s"], rates["p95_s"] = quantile(buckets, 0.5), quantile(buckets, 0.95)
    Sample.objects.create(
        endpoint=endpoint, at=now, replicas=counts["replicas"], serving=counts["serving"], waiting=load.waiting,
        totals=totals, **rates,
    )  # fmt: skip


def _count(condition: Q) -> Any:
    from django.db.models import Count

    return Count("pk", filter=condition)


def quantile(counts: list[int], q: float) -> float | None:
    """The ``q`` quantile of latencies counted per bucket (not cumulative), as the upper bound of
    the bucket it falls in (the largest finite bound for the last one); None without any."""
    total = sum(counts)
    if not total:
        return None
    rank, seen = q * total, 0
    for bound, count in zip(LATENCY_BUCKETS_S, counts, strict=False):
        seen += count
        if seen >= rank:
            return bound if math.isfinite(bound) else LATENCY_BUCKETS_S[-2]
    return LATENCY_BUCKETS_S[-2]
