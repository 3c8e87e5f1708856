"""Ray clusters through the API: requests checked and queued, admitted as a whole (head and
workers together), and no other tenant's business."""

from __future__ import annotations

from typing import Any

from apps.inventory.models import Allocation
from apps.rayclusters.models import RayCluster
from apps.scheduling.adapter import run_cycle
from apps.workloads.models import PodSet
from tests.personas import World

URL = "/api/v1/ray-clusters/"


def _cluster(**fields: Any) -> dict[str, Any]:
    return {"workspace": "team-a", "name": "ray", "workers": 2, "gpu_type": "h100", "worker_gpus": "2", **fields}


def test_a_cluster_is_a_head_and_workers_admitted_together(world: World) -> None:
    client = world.client(world.alice)
    response = client.post(URL, _cluster(head_cpu_cores=2), format="json")
    assert response.status_code == 201, response.json()
    made = response.json()
    assert made["state"] == "QUEUED" and made["dashboard_url"] is None
    roles = sorted(PodSet.objects.filter(workload_id=made["id"]).values_list("role", "replicas", "gpus", "cpu_cores"))
    assert [(r, n, str(g), c) for r, n, g, c in roles] == [("head", 1, "0.000", 2), ("worker", 2, "2.000", 1)]
    run_cycle()
    cluster = RayCluster.objects.get(pk=made["id"])
    assert cluster.state == RayCluster.State.ADMITTED
    held = sorted(Allocation.objects.filter(workload=cluster).values_list("podset__role", "replica"))
    assert held == [("worker", 0), ("worker", 0), ("worker", 1), ("worker", 1)]  # 2 GPUs each, the head none


def test_a_cluster_waits_whole_when_its_workers_do_not_all_fit(world: World) -> None:
    client = world.client(world.alice)
    client.post("/api/v1/jobs/", {"workspace": "team-a", "name": "big", "command": "true", "gpu_type": "h100",
                                  "gpus_per_replica": "1", "replicas": 1}, format="json")  # fmt: skip
    run_cycle()
    made = client.post(URL, _cluster(workers=1), format="json").json()  # 2 GPUs: 3 of the quota's 4 held
    run_cycle()
    assert RayCluster.objects.get(pk=made["id"]).state == RayCluster.State.ADMITTED
    second = client.post(URL, _cluster(name="second", workers=2, worker_gpus="1"), format="json").json()
    run_cycle()
    waiting = RayCluster.objects.get(pk=second["id"])
    # One of its workers would fit in the quota's last GPU: none is admitted, nothing held by halves.
    assert waiting.state == RayCluster.State.QUEUED and waiting.wait_reason
    assert not Allocation.objects.filter(workload=waiting).exists()


def test_bad_requests_get_field_messages(world: World) -> None:
    client = world.client(world.alice)
    cases = [
        (_cluster(head_cpu_cores=0), "head_cpu_cores"),
        (_cluster(workers=257), "workers"),
        (_cluster(workers=100), "worker_gpus"),  # 200 GPUs: more than the quota could ever hold
        (_cluster(worker_gpus="2", gpu_type=""), "gpu_type"),
        (_cluster(worker_profile="gpu-1", worker_gpus="1"), "worker_gpus"),
        (_cluster(name="Not A Name"), "name"),
    ]
    for body, field in cases:
        response = client.post(URL, body, format="json")
        assert response.status_code in (400, 409), (body, response.json())  # 409: past a hard limit
        assert field in response.json()["error"]["fields"], (body, response.json())
    assert not RayCluster.objects.exists()


def test_a_profile_sizes_a_role(world: World) -> None:
    client = world.client(world.alice)
    body = {k: v for k, v in _cluster(worker_profile="gpu-1").items() if k not in ("worker_gpus", "gpu_type")}
    made = client.post(URL, body, format="json")
    assert made.status_code == 201, made.json()
    cluster = RayCluster.objects.get(pk=made.json()["id"])
    assert (cluster.worker_gpus, cluster.gpu_type) == (world.gpu_1.gpu_count, world.gpu_1.gpu_type)


def test_another_tenant_sees_nothing_and_a_viewer_cannot_change_it(world: World) -> None:
    made = world.client(world.alice).post(URL, _cluster(), format="json").json()
    charlie = world.client(world.charlie)
    assert charlie.get(f"{URL}{made['id']}/").status_code == 404
    assert charlie.delete(f"{URL}{made['id']}/").status_code == 404
    assert charlie.post(URL, {**_cluster(), "name": "mine"}, format="json").status_code in (400, 403, 404)
    victor = world.client(world.victor)  # may look at team A, not change it
    assert victor.get(f"{URL}{made['id']}/").status_code == 200
    assert victor.delete(f"{URL}{made['id']}/").status_code == 403
    assert victor.post(URL, {**_cluster(), "name": "viewer"}, format="json").status_code == 403
    assert RayCluster.objects.get(pk=made["id"]).state == RayCluster.State.QUEUED


def test_deleting_a_queued_cluster_ends_it_at_once(world: World) -> None:
    client = world.client(world.alice)
    made = client.post(URL, _cluster(), format="json").json()
    assert client.delete(f"{URL}{made['id']}/").status_code == 204
    assert client.get(f"{URL}{made['id']}/").json()["state"] == "STOPPED"
    assert client.delete(f"{URL}{made['id']}/").status_code == 409


def test_gpu_use_over_time_counts_a_clusters_workers_from_admission_to_its_end(world: World) -> None:
    from datetime import timedelta

    from django.utils import timezone

    from apps.web.usage import held_intervals

    client = world.client(world.alice)
    made = client.post(URL, _cluster(name="held"), format="json").json()  # 2 workers x 2 GPUs, the head none
    run_cycle()
    now = timezone.now()
    held = held_intervals([world.team_a.pk], now - timedelta(hours=1), now)
    assert [(t, g) for t, g, _, _ in held] == [("h100", 4.0)]
    assert held_intervals([world.team_b.pk], now - timedelta(hours=1), now) == []
    cluster = RayCluster.objects.get(pk=made["id"])
    cluster.state, cluster.finished_at = RayCluster.State.STOPPED, now - timedelta(minutes=5)
    cluster.save(update_fields=["state", "finished_at"])
    assert [(g, end) for _, g, _, end in held_intervals([world.team_a.pk], now - timedelta(hours=1), now)] == [
        (4.0, cluster.finished_at)
    ]
    assert held_intervals([world.team_a.pk], now - timedelta(minutes=1), now) == []  # ended before the window
