"""Endpoint replicas as a kind of workload of the host (apps/workloads/host.py).

An admitted replica is started (its backend returns once the server answers: the model loaded);
a serving one is watched (a server that dies fails the replica, which the autoscaler replaces); a
replica asked to stop (scaled down, rolled out, its endpoint deleted) or preempted is stopped. Its
backend state is kept once it stopped, so that the server's log stays readable.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db.models import Q

from apps.inference import actions
from apps.inference.models import Replica
from apps.inventory.models import Allocation
from apps.workloads import host
from apps.workloads.host import Kind, Phase
from apps.workspaces.disks import disk_for
from apps.workspaces.unix import run_as_for
from workers.backends import servers
from workers.backends.base import Endpoint, InferenceSpec, PolicyRefusal, Progress, Status
from workers.backends.pyenv import BUILD_TIMEOUT_S

State = Replica.State


class ReplicaKind(Kind):
    name = "replica"
    model = Replica
    start_states = (State.ADMITTED,)
    live_states = Replica.LIVE_STATES
    keeps_state_after_stop = True
    # A server's graceful stop lets the requests it is answering finish.
    STOP_GRACE_S = 30.0

    def rows(self) -> Any:
        return Replica.objects.select_related("workspace", "cluster", "endpoint__profile")

    def phase(self, row: Replica) -> Phase | None:
        if row.state == State.ADMITTED:
            return Phase.START
        if row.backend_state is None or row.backend_stopped:
            return None
        if row.state == State.READY:
            return Phase.WATCH
        if row.state in (State.STOPPING, State.PREEMPTED):
            return Phase.STOP
        return None

    def due(self, lost_before: datetime) -> Iterable[int]:
        live = Q(
            state__in=[State.READY, State.STOPPING, State.PREEMPTED], backend_stopped=False, backend_state__isnull=False
        )
        lost = Q(state=State.ADMITTED, admitted_at__lt=lost_before)
        return Replica.objects.filter(live | lost).values_list("pk", flat=True)

    def start_timeout_s(self) -> float:
        return float(settings.PORTAL_INFERENCE_START_TIMEOUT_S)

    def claim_timeout_s(self) -> float:
        # The first start of a server builds its environment (a compiled server: minutes).
        return self.start_timeout_s() + BUILD_TIMEOUT_S

    def grace_s(self, row: Replica) -> float:
        return self.STOP_GRACE_S

    def spec(self, row: Replica) -> InferenceSpec:
        endpoint = row.endpoint
        profile = endpoint.profile
        devices = [
            str(index)
            for index in Allocation.objects.filter(workload=row)
            .order_by("gpu__index")
            .values_list("gpu__index", flat=True)
        ]
        workspace_dir = Path(settings.PORTAL_WORK_DIR) / row.workspace.name
        return InferenceSpec(
            key=self.key(row.pk),
            workspace=row.workspace.name,
            name=row.name,
            work_dir=str(workspace_dir),
            server=profile.server,
            model_path=str(_model(profile.server, workspace_dir / endpoint.model_path)),
            served_name=endpoint.name,
            endpoint=f"{endpoint.pk}",
            extra_args=[str(arg) for arg in profile.server_args],
            image=profile.image,
            devices=devices,
            gpu_type=row.gpu_type,
            gpus=float(row.gpus),
            cpu_cores=float(row.cpu_cores),
            memory_gb=float(row.memory_gb),
            start_timeout_s=self.start_timeout_s(),
            api_key=row.api_key,
            run_as=run_as_for(row.workspace, row.cluster),
            disk=disk_for(row.workspace, row.cluster),
        )

    def record_start(self, row: Replica, endpoint: Endpoint, *, restarted: bool) -> None:
        actions.record_replica_ready(row, target=endpoint.url or f"http://{endpoint.host}:{endpoint.port}")

    def record_start_failure(self, row: Replica, reason: str, *, timed_out: bool) -> None:
        actions.record_replica_end(row, State.FAILED, reason)

    def changes(self, row: Replica, progress: Progress | None, observed: Any) -> bool:
        return False

    def record_exit(self, row: Replica, status: Status, progress: Progress | None) -> None:
        code = status.exit_code
        message = status.message or (f"its server exited with {code}" if code is not None else "its server ended")
        actions.record_replica_end(row, State.FAILED, f"the server stopped serving: {message}")

    def record_stop(self, row: Replica, ran: bool) -> None:
        actions.record_replica_end(row, State.STOPPED, "")

    def record_host_stop(self, row: Replica) -> None:
        row.save()
        if row.state not in Replica.FINAL_STATES:
            actions.record_replica_end(row, State.STOPPED, "the portal stopped")


def _model(server: str, path: Path) -> Path:
    """What the server loads: for one that loads a file, the one in a directory the endpoint names;
    where there is no such one file any more, the path itself (the server says what it found)."""
    try:
        return servers.model_file(server, path)
    except PolicyRefusal:
        return path


def register() -> None:
    host.register(ReplicaKind())
