"""The contract's shared behaviour: ``start()`` dispatching on the spec, and the hooks' defaults."""

from __future__ import annotations

from typing import Any

import pytest

from workers.backends.base import (
    Backend,
    BackendError,
    Endpoint,
    GpuInfo,
    InstanceSpec,
    JobSpec,
    Keep,
    NodeInfo,
    NotebookSpec,
    PolicyRefusal,
    Progress,
    Status,
    last_progress,
)


class Minimal(Backend):
    """Only what the contract makes abstract."""

    name = "minimal"

    def poll(self) -> Status:
        return Status("running")

    def stop(self, grace_s: float = 10.0) -> None:
        pass

    def get_state(self) -> dict[str, Any]:
        return {}

    def load_state(self, state: dict[str, Any]) -> None:
        pass

    def clear_state(self) -> None:
        pass

    def logs(self, replica: int = 0, offset: int = 0) -> tuple[bytes, int]:
        return b"", offset

    def progress(self) -> Progress | None:
        return None


class Recording(Minimal):
    """Runs every kind, saying which hook was called."""

    def start_job(self, spec: JobSpec) -> Endpoint:
        return Endpoint("job", 1)

    def start_instance(self, spec: InstanceSpec) -> Endpoint:
        return Endpoint("instance", 2)

    def start_notebook(self, spec: NotebookSpec) -> Endpoint:
        return Endpoint("notebook", 3)

    def discover(self) -> list[GpuInfo]:
        return [GpuInfo(f"{node}:{i}", "h100", 0) for node in ("b", "a") for i in range(2)]


JOB = JobSpec(key="job-1", workspace="vision", name="train", command="true", work_dir="/unused")
INSTANCE = InstanceSpec(key="instance-1", workspace="vision", name="dev", work_dir="/unused")
NOTEBOOK = NotebookSpec(key="notebook-1", workspace="vision", name="nb", work_dir="/unused", base_url="/", token="t")


def test_start_calls_the_hook_of_the_specs_kind() -> None:
    backend = Recording()
    assert [backend.start(spec).host for spec in (JOB, INSTANCE, NOTEBOOK)] == ["job", "instance", "notebook"]


@pytest.mark.parametrize(("spec", "kind"), [(JOB, "jobs"), (INSTANCE, "instances"), (NOTEBOOK, "notebooks")])
def test_a_kind_the_backend_does_not_run_is_a_permanent_error(spec: Any, kind: str) -> None:
    with pytest.raises(BackendError) as refused:
        Minimal().start(spec)
    assert refused.value.permanent
    assert refused.value.message == f"the minimal backend cannot run {kind}"


def test_by_default_there_are_no_artifacts_no_kubeconfig_and_nothing_to_sweep() -> None:
    backend = Minimal()
    assert backend.artifacts().files == [] and backend.artifacts().note() == ""
    assert backend.kubeconfig() is None
    assert backend.sweep_orphans("/srv/portal") == []
    assert backend.sweep_orphans("/srv/portal", Keep(({"version": 1},), frozenset({"job-1"}))) == []


def test_by_default_a_backend_refuses_to_discover_saying_so() -> None:
    for hook in (Minimal().discover, Minimal().nodes):
        with pytest.raises(PolicyRefusal, match="^The minimal backend cannot discover its nodes and GPUs.$"):
            hook()


def test_by_default_the_nodes_are_those_the_gpus_name() -> None:
    assert Recording().nodes() == [NodeInfo("b"), NodeInfo("a")]
    assert NodeInfo("b") == NodeInfo("b", cpu_cores=0, memory_mb=0, state="ready", pool="default")


def test_the_last_progress_line_wins_clamped() -> None:
    assert last_progress(b"PROGRESS 0.2\nwork\nPROGRESS 1.5\n") == Progress(1.0, "PROGRESS 1.5")
    assert last_progress(b"no progress here\n") is None
