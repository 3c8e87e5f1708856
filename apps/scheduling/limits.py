"""Hard limits on one request (its size, its runtime): checked when it is made, never by the scheduler.

A request that fits the quota shape is accepted and waits for room; one the workspace could
never be given is refused at once with a message that says why.
"""

from __future__ import annotations

from collections import Counter
from decimal import Decimal

from django.utils import timezone

from apps.errors import ActionError, LimitExceeded
from apps.inventory.models import GPU
from apps.provisioning.models import ProvisioningRequest
from apps.scheduling.types import gpu_shape_problem
from apps.workspaces.models import GPUQuota, Workspace

ONE = Decimal("1")


def _fmt(value: Decimal) -> str:
    return f"{value.normalize():f}"


def check_gpu_shape(gpus_per_replica: Decimal, field: str = "gpus_per_replica") -> None:
    """GPUs per replica: 0 (no GPU: the work runs on CPU cores alone), a share of one device
    (SHARES), or a whole number of devices."""
    problem = gpu_shape_problem(gpus_per_replica)
    if problem:
        raise ActionError(problem, field=field)


def gpus_per_node(gpu_type: str) -> dict[int, list[int]]:
    """For each enabled cluster, the number of `gpu_type` GPUs on each of its nodes (a drained node
    comes back: work that needs it waits rather than being refused)."""
    per_node = Counter(
        GPU.objects.filter(gpu_type=gpu_type, node__pool__cluster__enabled=True).values_list(
            "node__pool__cluster_id", "node_id"
        )
    )
    clusters: dict[int, list[int]] = {}
    for (cluster_id, _), count in per_node.items():
        clusters.setdefault(cluster_id, []).append(count)
    return clusters


def replica_slots(node_sizes: list[int], gpus_per_replica: Decimal) -> int:
    """How many replicas of this size a cluster could hold at once when empty."""
    if gpus_per_replica < ONE:
        return sum(size * int(ONE / gpus_per_replica) for size in node_sizes)
    return sum(size // int(gpus_per_replica) for size in node_sizes)


def gpu_ceiling(workspace: Workspace, gpu_type: str) -> tuple[Decimal, str]:
    """The most GPUs of a type one workload of the workspace could ever be given, and how that is made
    up: its quota's, or its largest reservation's if that is more (a workload runs in one or the other)."""
    ceiling, how = _quota_ceiling(workspace, gpu_type)
    reserved = (
        ProvisioningRequest.objects.filter(
            workspace=workspace, gpu_type=gpu_type, state__in=ProvisioningRequest.HOLDING_STATES,
            held_end__gt=timezone.now(),
        )
        .order_by("-gpus")
        .values_list("gpus", flat=True)
        .first()
    )  # fmt: skip
    if reserved is not None and reserved > ceiling:
        return Decimal(reserved), f"its reservation of {reserved}"
    return ceiling, how


def _quota_ceiling(workspace: Workspace, gpu_type: str) -> tuple[Decimal, str]:
    quota = GPUQuota.objects.filter(workspace=workspace, gpu_type=gpu_type).first()
    if quota is None:  # the engine gives a type without a quota row nothing, borrowed or not
        return Decimal("0"), f"no {gpu_type} quota"
    borrowed, words = borrowing(workspace, quota)
    joined = f", {words}" if borrowed is None else f" + {words}"
    return quota.gpus + (borrowed or 0), f"{_fmt(quota.gpus)} nominal{joined}"


def borrowing(workspace: Workspace, quota: GPUQuota) -> tuple[Decimal | None, str]:
    """What a quota's workspace may borrow of its type from its cohort, and how the pages and the
    refusals say it: (None, "no borrowing") where it does not borrow (it may not, or has no cohort),
    else the most its cohort's others lend, within its own borrowing limit ("2 borrowable")."""
    if not workspace.can_borrow or workspace.cohort_id is None:
        return None, "no borrowing"
    cohort = GPUQuota.objects.filter(workspace__cohort_id=workspace.cohort_id, gpu_type=quota.gpu_type).exclude(
        workspace=workspace
    )
    lendable = sum(
        (min(q.gpus, q.lending_limit) if q.lending_limit is not None else q.gpus for q in cohort), Decimal("0")
    )
    if quota.borrowing_limit is not None:
        lendable = min(lendable, quota.borrowing_limit)
    return lendable, f"{_fmt(lendable)} borrowable"


def check_runtime_limit(workspace: Workspace, max_runtime_s: int | None) -> int | None:
    """The runtime limit a request runs under: its own, or the workspace's where it names none;
    refused where it asks for more than the workspace allows."""
    if workspace.max_runtime_s is None:
        return max_runtime_s
    if max_runtime_s is None:
        return workspace.max_runtime_s
    if max_runtime_s > workspace.max_runtime_s:
        raise ActionError(
            f"Workspace {workspace.name} allows at most {workspace.max_runtime_s} s of runtime.",
            field="max_runtime_s",
        )
    return max_runtime_s


def check_request_size(
    workspace: Workspace,
    *,
    gpu_type: str,
    gpus_per_replica: Decimal,
    replicas: int,
    cpu_cores: int,
    memory_gb: int,
) -> None:
    """Refuse a request larger than the workspace could ever be given."""
    check_gpu_shape(gpus_per_replica)
    if cpu_cores * replicas > workspace.cpu_cores:
        raise LimitExceeded(
            f"This asks for {cpu_cores * replicas} CPU cores; workspace {workspace.name} may use at most "
            f"{workspace.cpu_cores}.",
            field="cpu_cores",
        )
    if memory_gb * replicas > workspace.memory_gb:
        raise LimitExceeded(
            f"This asks for {memory_gb * replicas} GB of memory; workspace {workspace.name} may use at most "
            f"{workspace.memory_gb} GB.",
            field="memory_gb",
        )
    if gpus_per_replica == 0:
        return
    if not gpu_type:
        raise ActionError("Name the GPU type of a request with GPUs.", field="gpu_type")
    if not workspace.allows_gpu_type(gpu_type):
        allowed = ", ".join(workspace.allowed_gpu_types)
        raise ActionError(
            f"Workspace {workspace.name} may not use {gpu_type} GPUs (allowed: {allowed}).", field="gpu_type"
        )
    total = gpus_per_replica * replicas
    ceiling, how = gpu_ceiling(workspace, gpu_type)
    if total > ceiling:
        raise LimitExceeded(
            f"This asks for {_fmt(total)} {gpu_type} GPUs; workspace {workspace.name} can never hold more "
            f"than {_fmt(ceiling)} ({how}).",
            field="gpus_per_replica",
        )
    clusters = gpus_per_node(gpu_type)
    largest = max((max(sizes) for sizes in clusters.values()), default=0)
    if largest == 0:
        raise LimitExceeded(f"No cluster has {gpu_type} GPUs.", field="gpu_type")
    if gpus_per_replica > largest:
        raise LimitExceeded(
            f"One replica asks for {_fmt(gpus_per_replica)} {gpu_type} GPUs, but the largest node has "
            f"{largest}; split the work into more replicas.",
            field="gpus_per_replica",
        )
    room = max(replica_slots(sizes, gpus_per_replica) for sizes in clusters.values())
    if replicas > room:
        raise LimitExceeded(
            f"This gang asks for {replicas} replicas of {_fmt(gpus_per_replica)} {gpu_type} GPUs at once, but no "
            f"cluster can hold more than {room} of them.",
            field="replicas",
        )
