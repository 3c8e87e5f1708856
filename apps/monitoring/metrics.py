"""The portal's Prometheus metrics, read from the database at each scrape (`/metrics`).

Every figure is the database's: whichever process changed it (the web, a worker, the scheduler
loop), a scrape of any web process sees it, and a restart loses nothing. Labels are bounded:
workspace, GPU type, cluster, kind and state, never a workload's id or name. Counters are totals
kept by the portal (audit events, the scheduler's totals), so `rate()` and `increase()` work.
Gauges of what the portal knows about (the queue, GPUs and their allocation) have a sample, 0
included, for every label set it knows: each cluster and GPU type of the inventory, each workspace
and GPU type with a quota (and each kind, for the queue), so that a graph shows 0, not "no data".

See docs/operations.md for the list and how to scrape it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from datetime import timedelta
from decimal import Decimal
from typing import Any

from django.db.models import Count, F, Min, Q, Sum
from django.utils import timezone
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from apps.audit.events import Event
from apps.audit.models import AuditEvent
from apps.elastic.models import PoolScaling, ScalingDecision
from apps.inventory.models import GPU, Allocation, Node
from apps.monitoring.models import SchedulerStats
from apps.telemetry.models import GpuSample
from apps.telemetry.record import FRESH_S, RAW
from apps.workloads.kinds import KINDS
from apps.workloads.models import PodSet, Workload
from apps.workspaces.models import GPUQuota

# How long workloads waited from submission to their start, in seconds: the histogram's buckets.
WAIT_BUCKETS = (10, 30, 60, 300, 900, 1800, 3600, 7200, 21600, 86400)
# Preemption reasons, as the scheduler words them (apps/scheduling/preemption.py).
PREEMPTION_REASONS = {"quota": "preempted to give workspace", "priority": "preempted for higher-priority"}
NO_GPU = ""  # the gpu_type label of work that asks for no GPU


def _gauge(
    name: str, doc: str, labels: list[str], rows: Iterable[tuple[Any, ...]], known: Iterable[tuple[Any, ...]] = ()
) -> GaugeMetricFamily:
    """A gauge of `rows` (label values..., value), with a 0 for each label set in `known` that has none."""
    values: dict[tuple[str, ...], float] = {}
    for *labelled, value in rows:
        values[tuple(str(v or "") for v in labelled)] = float(value or 0)
    for label_set in known:
        values.setdefault(tuple(str(v or "") for v in label_set), 0.0)
    family = GaugeMetricFamily(name, doc, labels=labels)
    for key, value in sorted(values.items()):
        family.add_metric(list(key), value)
    return family


def _inventory_types() -> set[tuple[str, str]]:
    """Every (cluster, GPU type) of the inventory, whatever its nodes' state."""
    return set(GPU.objects.values_list("node__pool__cluster__name", "gpu_type").distinct().order_by())


def _quota_types() -> set[tuple[str, str]]:
    """Every (workspace, GPU type) with a quota."""
    return set(GPUQuota.objects.values_list("workspace__name", "gpu_type").distinct().order_by())


class PortalCollector(Collector):
    def collect(self) -> Iterator[Metric]:
        now = timezone.now()
        yield from self._queue(now)
        yield from self._capacity()
        yield from self._measured(now)
        yield from self._workloads()
        yield from self._scheduler()
        yield self._waits()
        yield from self._endpoints(now)
        yield from self._elastic()

    def _elastic(self) -> Iterator[Metric]:
        """Elastic node pools: nodes by power state against the pool's limits, and the autoscaler's
        decisions (apps/elastic)."""
        pools = list(PoolScaling.objects.select_related("pool__cluster"))
        if not pools:
            return
        labels = ["cluster", "pool"]
        names = {s.pool_id: (s.pool.cluster.name, s.pool.name) for s in pools}
        states = Node.objects.filter(pool_id__in=names).values_list("pool_id", "state").annotate(n=Count("id"))
        yield _gauge(
            "gpuportal_elastic_nodes", "Nodes of elastic pools by power state.", [*labels, "state"],
            ((*names[pool], state, n) for pool, state, n in states.order_by()),
            ((*names[s.pool_id], state) for s in pools for state in ("ready", "powered_down", "powering_up")),
        )  # fmt: skip
        yield _gauge("gpuportal_elastic_nodes_min", "An elastic pool's minimum of nodes.", labels,
                     ((*names[s.pool_id], s.min_nodes) for s in pools))  # fmt: skip
        yield _gauge("gpuportal_elastic_nodes_max", "An elastic pool's maximum of nodes.", labels,
                     ((*names[s.pool_id], s.max_nodes) for s in pools))  # fmt: skip
        yield _gauge("gpuportal_elastic_gpu_hours_month", "GPU-hours an elastic pool ran above its minimum this month.",
                     labels, ((*names[s.pool_id], s.used_gpu_hours) for s in pools))  # fmt: skip
        decisions = CounterMetricFamily(
            "gpuportal_elastic_decisions", "The autoscaler's decisions, by action.", labels=[*labels, "action"]
        )
        counted = ScalingDecision.objects.filter(pool_id__in=names).values_list("pool_id", "action")
        for pool, action, n in counted.annotate(n=Count("id")).order_by():
            decisions.add_metric([*names[pool], action], float(n))
        yield decisions

    def _queue(self, now: Any) -> Iterator[Metric]:
        length = GaugeMetricFamily(
            "gpuportal_queue_workloads", "Workloads waiting to be admitted.", labels=["workspace", "gpu_type", "kind"]
        )
        gpus = GaugeMetricFamily(
            "gpuportal_queue_gpus", "GPUs asked for by the workloads waiting.", labels=["workspace", "gpu_type"]
        )
        oldest = GaugeMetricFamily(
            "gpuportal_queue_oldest_wait_seconds",
            "How long the longest-waiting workload has waited.",
            labels=["workspace", "gpu_type"],
        )
        asked: dict[tuple[str, str], Decimal] = {}
        first: dict[tuple[str, str], Any] = {}
        counted: dict[tuple[str, str, str], int] = {}
        known = _quota_types()
        for kind, info in sorted(KINDS.items()):
            if info.scheduling is None:
                continue
            for key in known:  # 0 where nothing of this kind waits
                counted[(*key, kind)] = 0
            waiting = PodSet.objects.filter(workload__kind=kind, workload__state=info.scheduling.queued)
            with_gpus = (
                waiting.filter(gpus__gt=0)
                .values_list("workload__workspace__name", "gpu_type")
                .annotate(
                    n=Count("workload", distinct=True),
                    gpus=Sum(F("gpus") * F("replicas")),
                    since=Min("workload__created_at"),
                )
                .order_by()
            )
            without = (
                Workload.objects.filter(kind=kind, state=info.scheduling.queued)
                .exclude(podsets__gpus__gt=0)
                .values_list("workspace__name")
                .annotate(n=Count("pk"), since=Min("created_at"))
                .order_by()
            )
            rows = [*with_gpus, *((workspace, NO_GPU, n, 0, since) for workspace, n, since in without)]
            for workspace, gpu_type, n, total, since in rows:
                key = (workspace, gpu_type or NO_GPU)
                counted[(*key, kind)] = n
                asked[key] = asked.get(key, Decimal(0)) + Decimal(total or 0)
                first[key] = min(first.get(key, since), since)
        for (workspace, gpu_type, kind), n in sorted(counted.items()):
            length.add_metric([workspace, gpu_type, kind], n)
        for key in sorted(known | set(asked)):
            gpus.add_metric(list(key), float(asked.get(key, 0)))
            waited = (now - first[key]).total_seconds() if key in first else 0.0
            oldest.add_metric(list(key), max(0.0, waited))
        yield from (length, gpus, oldest)

    def _capacity(self) -> Iterator[Metric]:
        inventory, quotas = _inventory_types(), _quota_types()
        yield _gauge(
            "gpuportal_gpus",
            "GPUs in the inventory, on nodes that take work.",
            ["cluster", "gpu_type"],
            GPU.objects.filter(node__state=Node.State.READY)
            .values_list("node__pool__cluster__name", "gpu_type")
            .annotate(n=Count("pk"))
            .order_by(),
            inventory,
        )
        yield _gauge(
            "gpuportal_gpus_allocated",
            "GPUs held by workloads (shares of a device add up).",
            ["cluster", "gpu_type"],
            Allocation.objects.values_list("gpu__node__pool__cluster__name", "gpu__gpu_type")
            .annotate(n=Sum("fraction"))
            .order_by(),
            inventory,
        )
        yield _gauge(
            "gpuportal_workspace_gpus_allocated",
            "GPUs held by each workspace's workloads.",
            ["workspace", "gpu_type"],
            Allocation.objects.values_list("workload__workspace__name", "gpu__gpu_type")
            .annotate(n=Sum("fraction"))
            .order_by(),
            quotas,
        )
        yield _gauge(
            "gpuportal_workspace_quota_gpus",
            "Each workspace's nominal GPU quota.",
            ["workspace", "gpu_type"],
            GPUQuota.objects.values_list("workspace__name", "gpu_type", "gpus").order_by(),
        )
        yield _gauge(
            "gpuportal_nodes",
            "Nodes, by state.",
            ["cluster", "state"],
            Node.objects.values_list("pool__cluster__name", "state").annotate(n=Count("pk")).order_by(),
        )

    def _measured(self, now: Any) -> Iterator[Metric]:
        """GPU utilisation as measured (apps/telemetry), from each device's fresh sample: none
        where there is no telemetry, rather than zeros."""
        fresh = GpuSample.objects.filter(resolution_s=RAW, at__gte=now - timedelta(seconds=FRESH_S))
        newest = fresh.order_by("gpu_id", "-at").values_list(
            "gpu_id", "gpu__node__pool__cluster__name", "gpu__gpu_type", "workspace__name", "utilisation"
        )
        seen: set[int] = set()
        by_type: dict[tuple[str, str], list[float]] = {}
        by_workspace: dict[tuple[str, str], list[float]] = {}
        for gpu_id, cluster, gpu_type, workspace, utilisation in newest:
            if gpu_id in seen:
                continue
            seen.add(gpu_id)
            by_type.setdefault((cluster, gpu_type), []).append(utilisation / 100)
            if workspace:
                by_workspace.setdefault((workspace, gpu_type), []).append(utilisation / 100)
        measured = GaugeMetricFamily(
            "gpuportal_gpus_measured", "GPUs with a fresh telemetry sample.", labels=["cluster", "gpu_type"]
        )
        ratio = GaugeMetricFamily(
            "gpuportal_gpu_utilisation_ratio",
            "Mean measured utilisation of the GPUs with telemetry (0 to 1).",
            labels=["cluster", "gpu_type"],
        )
        for key, values in sorted(by_type.items()):
            measured.add_metric(list(key), len(values))
            ratio.add_metric(list(key), sum(values) / len(values))
        held = GaugeMetricFamily(
            "gpuportal_workspace_gpu_utilisation_ratio",
            "Mean measured utilisation of the GPUs each workspace holds (0 to 1), where measured.",
            labels=["workspace", "gpu_type"],
        )
        for key, values in sorted(by_workspace.items()):
            held.add_metric(list(key), sum(values) / len(values))
        yield from (measured, ratio, held)

    def _workloads(self) -> Iterator[Metric]:
        states = GaugeMetricFamily("gpuportal_workloads", "Workloads, by kind and state.", labels=["kind", "state"])
        counted = dict(
            ((kind, state), n)
            for kind, state, n in Workload.objects.values_list("kind", "state").annotate(n=Count("pk")).order_by()
        )
        for kind, info in sorted(KINDS.items()):
            for state in info.states:  # every state, 0 included, so a series never vanishes
                states.add_metric([kind, state], counted.get((kind, state), 0))
        yield states
        counters = _counters()
        counted = {str(event) for _, _, _, series in counters for _, event in series}
        events = dict(
            AuditEvent.objects.filter(action__in=counted).values_list("action").annotate(n=Count("pk")).order_by()
        )
        for name, doc, labels, series in counters:
            family = CounterMetricFamily(name, doc, labels=labels)
            for values, event in series:
                family.add_metric(values, events.get(str(event), 0))
            yield family
        preemptions = CounterMetricFamily(
            "gpuportal_preemptions", "Workloads preempted by the scheduler, by reason.", labels=["reason"]
        )
        preempted = AuditEvent.objects.filter(action=Event.JOB_PREEMPT.value)
        counts = preempted.aggregate(
            total=Count("pk"),
            **{
                reason: Count("pk", filter=Q(data__reason__startswith=text))
                for reason, text in PREEMPTION_REASONS.items()
            },
        )
        for reason in PREEMPTION_REASONS:
            preemptions.add_metric([reason], counts[reason])
        preemptions.add_metric(["other"], counts["total"] - sum(counts[r] for r in PREEMPTION_REASONS))
        yield preemptions

    def _scheduler(self) -> Iterator[Metric]:
        stats = SchedulerStats.objects.filter(pk=SchedulerStats.ROW).first() or SchedulerStats()
        yield CounterMetricFamily("gpuportal_scheduler_cycles", "Scheduling cycles run.", value=stats.cycles)
        yield CounterMetricFamily(
            "gpuportal_scheduler_cycle_failures", "Scheduling cycles that failed.", value=stats.failures
        )
        yield CounterMetricFamily(
            "gpuportal_scheduler_cycle_seconds", "Time spent in scheduling cycles.", value=stats.cycle_seconds
        )
        yield GaugeMetricFamily(
            "gpuportal_scheduler_last_cycle_seconds", "How long the last scheduling cycle took.",
            value=stats.last_cycle_seconds,
        )  # fmt: skip
        yield GaugeMetricFamily(
            "gpuportal_scheduler_last_cycle_timestamp_seconds",
            "When the last scheduling cycle ended (Unix time; 0: none yet).",
            value=stats.last_cycle_at.timestamp() if stats.last_cycle_at else 0,
        )

    def _waits(self) -> Metric:
        """How long workloads waited from submission to their (first) start, as a histogram."""
        family = HistogramMetricFamily(
            "gpuportal_wait_seconds", "Time from submission to start, of workloads that started.", labels=["kind"]
        )
        for kind, info in sorted(KINDS.items()):
            if info.scheduling is None:
                continue
            started = Workload.objects.filter(kind=kind, started_at__isnull=False)
            wait = F("started_at") - F("created_at")
            counts = started.aggregate(
                total=Count("pk"),
                waited=Sum(wait),
                **{
                    f"le_{b}": Count("pk", filter=Q(started_at__lte=F("created_at") + timedelta(seconds=b)))
                    for b in WAIT_BUCKETS
                },
            )
            buckets = [(str(float(b)), counts[f"le_{b}"]) for b in WAIT_BUCKETS] + [("+Inf", counts["total"])]
            waited = counts["waited"]
            seconds = waited.total_seconds() if isinstance(waited, timedelta) else float(waited or 0) / 1e6
            family.add_metric([kind], buckets, max(0.0, seconds))
        return family

    def _endpoints(self, now: Any) -> Iterator[Metric]:
        """Each live inference endpoint's replicas (wanted, serving, its bounds) and the traffic the
        portal's proxy saw of it, every web process together (apps/inference/proxy.py)."""
        from apps.inference.models import LATENCY_BUCKETS_S, Endpoint, Replica
        from apps.inference.scaling import load_of

        labels = ["workspace", "endpoint"]
        replicas = GaugeMetricFamily(
            "gpuportal_endpoint_replicas", "Inference endpoints' replicas: desired, serving, min, max.",
            labels=[*labels, "kind"],
        )  # fmt: skip
        in_flight = GaugeMetricFamily(
            "gpuportal_endpoint_requests_in_flight", "Requests being answered.", labels=labels
        )
        waiting = GaugeMetricFamily(
            "gpuportal_endpoint_requests_waiting", "Requests waiting for a replica.", labels=labels
        )
        requests = CounterMetricFamily("gpuportal_endpoint_requests", "Requests answered or given up.", labels=labels)
        errors = CounterMetricFamily(
            "gpuportal_endpoint_errors", "Requests answered with a 5xx or given up.", labels=labels
        )
        tokens = CounterMetricFamily("gpuportal_endpoint_completion_tokens", "Tokens generated.", labels=labels)
        latency = HistogramMetricFamily(
            "gpuportal_endpoint_request_seconds", "Time from a request's arrival to its answer's end.", labels=labels
        )
        live = list(Endpoint.objects.filter(state__in=Endpoint.LIVE_STATES).select_related("workspace"))
        serving = dict(
            Replica.objects.filter(endpoint__in=live, state=Replica.State.READY)
            .values_list("endpoint_id")
            .annotate(n=Count("pk"))
            .values_list("endpoint_id", "n")
        )
        loads = load_of([e.pk for e in live], now)
        for endpoint in live:
            names = [endpoint.workspace.name, endpoint.name]
            for kind, value in (("desired", endpoint.desired_replicas), ("serving", serving.get(endpoint.pk, 0)),
                                ("min", endpoint.min_replicas), ("max", endpoint.max_replicas)):  # fmt: skip
                replicas.add_metric([*names, kind], value)
            load = loads[endpoint.pk]
            in_flight.add_metric(names, load.in_flight)
            waiting.add_metric(names, load.waiting)
            requests.add_metric(names, load.requests)
            errors.add_metric(names, load.errors)
            tokens.add_metric(names, load.tokens)
            cumulative, buckets = 0, []
            for bound, count in zip(LATENCY_BUCKETS_S, load.latency, strict=False):
                cumulative += count
                buckets.append(("+Inf" if bound == float("inf") else str(bound), cumulative))
            latency.add_metric(names, buckets, load.latency_sum)
        yield from (replicas, in_flight, waiting, requests, errors, tokens, latency)


def _counters() -> tuple[tuple[str, str, list[str], tuple[tuple[list[str], str], ...]], ...]:
    """The counters of audit events, by kind: admissions, submissions, failures."""
    kinds = sorted(KINDS.items())
    return (
        (
            "gpuportal_admissions",
            "Workloads admitted by the scheduler.",
            ["kind"],
            tuple(([name], info.scheduling.admit_event) for name, info in kinds if info.scheduling is not None),
        ),
        (
            "gpuportal_submissions",
            "Workloads submitted or launched.",
            ["kind"],
            tuple(([name], info.submit_event) for name, info in kinds),
        ),
        (
            "gpuportal_workload_failures",
            "Workloads that failed (their backend, their start or their own code).",
            ["kind"],
            tuple(([name], info.fail_event) for name, info in kinds),
        ),
    )


def registry() -> CollectorRegistry:
    """A registry of the portal's metrics alone (no process metrics of whichever web worker answers)."""
    made = CollectorRegistry(auto_describe=False)
    made.register(PortalCollector())
    return made
