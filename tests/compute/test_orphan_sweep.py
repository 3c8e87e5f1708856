"""The orphan sweep asks every cluster's backend, through the contract, to stop what no workload recorded.

The real sweeps (process groups on this machine, Slurm jobs) run in tests/workers/test_crash.py; here
the registry's answer is replaced by a backend that records what it was asked, the one narrow patch."""

from __future__ import annotations

from typing import Any

import pytest

from apps.compute.models import Instance
from apps.inventory.actions import do_save_cluster
from apps.inventory.models import Cluster
from apps.jobs.actions import check_submit_job
from apps.jobs.models import Job
from apps.workloads import host
from tests.personas import World
from workers.backends.base import Backend, BackendError, Keep


class Asked:
    """Stands for each cluster's backend: records the sweeps it was asked for."""

    def __init__(self, failing: set[str]) -> None:
        self.sweeps: dict[str, tuple[str, Keep]] = {}
        self.failing = failing

    def backend_for(self, cluster: Cluster, state: dict[str, Any] | None = None) -> Backend:
        asked = self

        class Sweeper:
            def sweep_orphans(self, owner: str, keep: Keep | None = None) -> list[str]:
                assert keep is not None
                asked.sweeps[cluster.name] = (owner, keep)
                if cluster.name in asked.failing:
                    raise BackendError("squeue timed out after 20s", permanent=False)
                return [f"{cluster.name}-orphan"]

        return Sweeper()  # type: ignore[return-value]


def _running_instance(world: World, cluster: Cluster, run: dict[str, Any]) -> Instance:
    instance = Instance.objects.create(
        workspace=world.team_a, name=f"box-{cluster.name}", profile=world.cpu_small, created_by=world.alice
    )
    running_there = {"state": Instance.State.RUNNING, "cluster": cluster, "backend_state": run}
    Instance.objects.filter(pk=instance.pk).update(**running_there)
    return instance


@pytest.fixture
def asked(monkeypatch: Any) -> Asked:
    answer = Asked(failing={"hpc-b"})
    monkeypatch.setattr(host, "backend_for", answer.backend_for)
    return answer


def test_every_enabled_cluster_and_every_one_holding_a_workload_is_swept(
    world: World, asked: Asked, settings: Any
) -> None:
    save = {"acting_user": world.admin}
    hpc_a = do_save_cluster(Cluster(), {"name": "hpc-a", "kind": "slurm"}, **save)
    hpc_b = do_save_cluster(Cluster(), {"name": "hpc-b", "kind": "slurm"}, **save)
    retired = do_save_cluster(Cluster(), {"name": "retired", "kind": "kubernetes", "enabled": False}, **save)
    do_save_cluster(Cluster(), {"name": "unused", "kind": "kubernetes", "enabled": False}, **save)
    local = Cluster.objects.get(name="local")
    _running_instance(world, local, {"version": 1, "replicas": [{"pid": 4242}]})
    _running_instance(world, hpc_a, {"version": 1, "job_id": "17"})
    _running_instance(world, hpc_b, {"version": 1, "job_id": "18"})
    _running_instance(world, retired, {"version": 1, "kind": "instance", "namespace": "gp-x"})
    admitted = check_submit_job(world.team_a, name="t", command="true", acting_user=world.alice)
    Job.objects.filter(pk=admitted.pk).update(state=Job.State.ADMITTED)

    # hpc-b does not answer: the others are swept all the same, and its orphans wait for the next sweep.
    assert host.sweep_orphans() == 3

    assert sorted(asked.sweeps) == ["hpc-a", "hpc-b", "local", "retired"]
    owner = str(settings.PORTAL_WORK_DIR)
    assert {owner} == {sweep[0] for sweep in asked.sweeps.values()}
    keeps = {name: sweep[1] for name, sweep in asked.sweeps.items()}
    assert all(keep.keys == {f"job-{admitted.pk}"} for keep in keeps.values())
    assert keeps["local"].states == ({"version": 1, "replicas": [{"pid": 4242}]},)
    # One Slurm controller lists both clusters' jobs: each keeps what either recorded.
    slurm_states = [{"version": 1, "job_id": "17"}, {"version": 1, "job_id": "18"}]
    assert list(keeps["hpc-a"].states) == list(keeps["hpc-b"].states) == slurm_states
    assert keeps["retired"].states == ({"version": 1, "kind": "instance", "namespace": "gp-x"},)
