"""A reconcile pass reads its Kubernetes workloads from one LIST per kind of object and namespace
(``KubernetesBackend.polling``), not from a GET per workload, and its answers are the ones each workload's
``poll()`` and ``progress()`` give alone: running, succeeded, failed, gone.

Through the official client over HTTP against kmock's API emulator (tests/backends/kmock_cluster.py), which
records every request it gets: the tests count them. The emulator does not filter by label selector, so every
object here carries the labels the portal's (or, for pods, their template's) would.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import Counter
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from apps.inventory.models import Cluster
from apps.jobs.models import Job
from apps.workloads.host import reconcile
from tests.backends.kmock_cluster import Emulator, running_emulator
from tests.backends.test_kuberay import READY, ray_spec
from tests.backends.test_kubernetes_backend import instance_spec, job_spec, notebook_spec
from tests.personas import World
from workers.backends import Progress, Status
from workers.backends import kuberay_objects as kro
from workers.backends import kubernetes_objects as ko
from workers.backends import kubernetes_vcluster as kv
from workers.backends.base import TIMEOUT_EXIT_CODE, UNKNOWN_EXIT_CODE
from workers.backends.kubernetes import KubernetesBackend, _workload_name
from workers.backends.registry import backend_for

SETTINGS = ko.KubeSettings(ingress_mode="path", ingress_host="portal.example.org")
SELECTOR = "app.kubernetes.io/managed-by=gpuportal"


@pytest.fixture
def cluster() -> Iterator[Emulator]:
    with running_emulator() as emulator:
        yield emulator


def backend(cluster: Emulator, state: dict[str, Any] | None = None) -> KubernetesBackend:
    """A backend as the registry builds one for a workload: new, from the cluster's connection and a saved state."""
    k8s = KubernetesBackend(
        settings=SETTINGS, host=cluster.url, start_timeout_s=5, stop_timeout_s=5, poll_interval_s=0.01
    )
    if state is not None:
        k8s.load_state(state)
    return k8s


class Requests:
    """What reached the emulator since the last call, as (method, path), and the query of each."""

    def __init__(self, cluster: Emulator) -> None:
        self.cluster = cluster
        self.seen = len(list(cluster.handler))

    def since(self) -> tuple[Counter[tuple[str, str]], list[dict[str, str]]]:
        requests = list(self.cluster.handler)
        new, self.seen = requests[self.seen :], len(requests)
        return Counter((r.method.value.upper(), r.url.path) for r in new), [dict(r.params) for r in new]


# -- starting workloads, with the tests as the controllers --------------------------------------------------------


def jobs_ns(workspace: str) -> str:
    return ko.jobs_namespace_name(workspace, SETTINGS)


def job_path(workspace: str, key: str) -> str:
    return f"/apis/batch/v1/namespaces/{jobs_ns(workspace)}/jobs/{ko.job_name(_workload_name(key))}"


def submit_job(cluster: Emulator, workspace: str, key: str) -> dict[str, Any]:
    """A job submitted (its Job suspended: running, as far as poll() can tell); its state."""
    k8s = backend(cluster)
    k8s.submit(job_spec(key=key, workspace=workspace, replicas=1))
    return k8s.get_state()


def job_pod(workspace: str, key: str, index: int, exit_code: int | None = None, at: str = "") -> dict[str, Any]:
    """A pod of the job's Job, labelled as the Job controller labels it: the template's labels and its own."""
    name = _workload_name(key)
    job = ko.job_name(name)
    labels = ko.portal_labels(ko.jobs_owner(workspace, SETTINGS), "job", name) | {
        "batch.kubernetes.io/job-name": job,
        "batch.kubernetes.io/job-completion-index": str(index),
    }
    pod: dict[str, Any] = {"metadata": {"name": f"{job}-{index}-x", "namespace": jobs_ns(workspace), "labels": labels}}
    if exit_code is not None:
        terminated = {"exitCode": exit_code, "finishedAt": at}
        pod["status"] = {"containerStatuses": [{"name": "main", "state": {"terminated": terminated}}]}
    return pod


def start_instance(cluster: Emulator, workspace: str, kind: str = "namespace") -> dict[str, Any]:
    k8s = backend(cluster)
    k8s.start(dataclasses.replace(instance_spec(kind=kind), key=f"instance-{workspace}", workspace=workspace))
    return k8s.get_state()


def start_notebook(cluster: Emulator, instance: dict[str, Any], name: str) -> dict[str, Any]:
    path = f"/apis/apps/v1/namespaces/{instance['namespace']}/statefulsets/{ko.notebook_name(name)}"
    ready = cluster.when(path, lambda obj: True, lambda: cluster.set_status(path, {"readyReplicas": 1}))
    k8s = backend(cluster)
    k8s.start(notebook_spec(instance, key=f"notebook-{name}", name=name, base_url=f"/notebooks/vision/{name}/"))
    ready.join()
    return k8s.get_state()


def ray_path(workspace: str, key: str, kind: str) -> str:
    plural = "rayjobs" if kind == "RayJob" else "rayclusters"
    namespace = kro.ray_namespace_name(workspace, SETTINGS)
    return f"/apis/ray.io/v1/namespaces/{namespace}/{plural}/{kro.cluster_name(_workload_name(key))}"


def start_ray(cluster: Emulator, workspace: str, key: str, entrypoint: str = "") -> dict[str, Any]:
    path = ray_path(workspace, key, "RayJob" if entrypoint else "RayCluster")
    status = (
        {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING", "rayClusterStatus": READY} if entrypoint else READY
    )
    operator = cluster.when(path, lambda obj: True, lambda: cluster.set_status(path, status))
    k8s = backend(cluster)
    k8s.start(ray_spec(key=key, workspace=workspace, entrypoint=entrypoint))
    operator.join()
    return k8s.get_state()


def submitter_pod(workspace: str, key: str) -> dict[str, Any]:
    name = _workload_name(key)
    labels = kro.cluster_labels(kro.ray_owner(workspace, SETTINGS), name, "submitter")
    namespace = kro.ray_namespace_name(workspace, SETTINGS)
    meta = {"name": f"{kro.cluster_name(name)}-submit", "namespace": namespace, "labels": labels}
    return {"metadata": meta | {"creationTimestamp": "2026-01-01T00:00:00Z"}}


# -- one LIST per kind and namespace ------------------------------------------------------------------------------


def test_a_pass_makes_one_list_per_kind_and_namespace_not_a_get_per_workload(cluster: Emulator) -> None:
    states = [submit_job(cluster, "vision", f"job-v{n}") for n in range(8)]
    states += [submit_job(cluster, "audio", f"job-a{n}") for n in range(4)]
    vision = start_instance(cluster, "vision")
    states += [vision, start_instance(cluster, "audio")]
    states += [start_notebook(cluster, vision, name) for name in ("lab", "eda")]
    states += [start_ray(cluster, "vision", "ray-1"), start_ray(cluster, "audio", "ray-2")]
    states += [start_ray(cluster, "vision", "ray-3", entrypoint="python tune.py")]
    requests = Requests(cluster)

    with backend(cluster).polling(states):
        listed, queries = requests.since()
        backends = [backend(cluster, state) for state in states]
        assert [k8s.poll().running for k8s in backends] == [True] * len(states)
        assert [k8s.progress() for k8s in backends] == [None] * len(states)  # no pod has a log yet
        assert requests.since()[0] == Counter()  # every answer came from the lists

    vision_ray, audio_ray = kro.ray_namespace_name("vision", SETTINGS), kro.ray_namespace_name("audio", SETTINGS)
    expected = [
        f"/apis/batch/v1/namespaces/{jobs_ns('vision')}/jobs",
        f"/apis/batch/v1/namespaces/{jobs_ns('audio')}/jobs",
        f"/api/v1/namespaces/{jobs_ns('vision')}/pods",
        f"/api/v1/namespaces/{jobs_ns('audio')}/pods",
        f"/apis/apps/v1/namespaces/{vision['namespace']}/statefulsets",
        "/api/v1/namespaces",
        f"/apis/ray.io/v1/namespaces/{vision_ray}/rayclusters",
        f"/apis/ray.io/v1/namespaces/{audio_ray}/rayclusters",
        f"/apis/ray.io/v1/namespaces/{vision_ray}/rayjobs",
        f"/api/v1/namespaces/{vision_ray}/pods",
    ]
    assert listed == Counter(("GET", path) for path in expected)
    assert all(query.get("labelSelector") == SELECTOR for query in queries)


def test_what_a_pass_says_is_as_old_as_its_lists(cluster: Emulator) -> None:
    states = [submit_job(cluster, "vision", f"job-{n}") for n in range(3)]
    with backend(cluster).polling(states):
        cluster.set_status(job_path("vision", "job-0"), {"conditions": [{"type": "Complete", "status": "True"}]})
        assert backend(cluster, states[0]).poll() == Status("running")
    assert backend(cluster, states[0]).poll() == Status("exited", 0, "exited")


def test_a_list_that_fails_leaves_its_workloads_to_be_read_alone(
    cluster: Emulator, caplog: pytest.LogCaptureFixture
) -> None:
    states = [submit_job(cluster, "vision", f"job-{n}") for n in range(3)]
    cluster.set_status(job_path("vision", "job-1"), {"conditions": [{"type": "Complete", "status": "True"}]})
    cluster.respond(f"get /apis/batch/v1/namespaces/{jobs_ns('vision')}/jobs", 500)
    requests = Requests(cluster)
    with caplog.at_level(logging.WARNING), backend(cluster).polling(states):
        answers = [backend(cluster, state).poll() for state in states]
    assert answers == [Status("running"), Status("exited", 0, "exited"), Status("running")]
    assert "listing the Jobs" in caplog.text
    read = requests.since()[0]
    jobs = f"/apis/batch/v1/namespaces/{jobs_ns('vision')}/jobs/"
    assert sorted(n for (method, path), n in read.items() if method == "GET" and path.startswith(jobs)) == [1, 1, 1]


# -- the same answers ---------------------------------------------------------------------------------------------


def failed(reason: str, message: str = "") -> dict[str, Any]:
    return {"conditions": [{"type": "Failed", "status": "True", "reason": reason, "message": message}]}


def workloads_in_every_condition(cluster: Emulator) -> dict[str, dict[str, Any]]:
    """Jobs, notebooks, instances and Ray clusters running, succeeded, failed and gone (one of them replaced by an
    object that is not the portal's), by name: their states."""
    states = {
        f"job-{name}": submit_job(cluster, "vision", f"job-{name}") for name in ("run", "ok", "fail", "late", "gone")
    }
    pods = f"/api/v1/namespaces/{jobs_ns('vision')}/pods"
    cluster.post(pods, job_pod("vision", "job-run", 0))
    cluster.respond(f"get {pods}/{ko.job_name('job-run')}-0-x/log", b"PROGRESS 0.25\nloss 3\nPROGRESS 0.5\n")
    cluster.set_status(job_path("vision", "job-ok"), {"conditions": [{"type": "Complete", "status": "True"}]})
    cluster.post(pods, job_pod("vision", "job-fail", 0, exit_code=143, at="2026-01-01T00:00:09Z"))
    cluster.post(pods, job_pod("vision", "job-fail", 1, exit_code=3, at="2026-01-01T00:00:05Z"))
    cluster.respond(f"get {pods}/{ko.job_name('job-fail')}-0-x/log", b"PROGRESS 0.9\nTraceback\n")
    cluster.set_status(job_path("vision", "job-fail"), failed("BackoffLimitExceeded"))
    cluster.set_status(job_path("vision", "job-late"), failed("DeadlineExceeded"))
    cluster.delete(job_path("vision", "job-gone"))

    instance = states["instance"] = start_instance(cluster, "vision")
    states["instance-gone"] = start_instance(cluster, "audio")
    cluster.delete(f"/api/v1/namespaces/{states['instance-gone']['namespace']}")
    states["vcluster-failed"] = start_instance(cluster, "speech", kind="vcluster")
    installer = f"/apis/batch/v1/namespaces/{states['vcluster-failed']['namespace']}/jobs/{kv.VCLUSTER_INSTALLER}"
    cluster.set_status(installer, failed("BackoffLimitExceeded", "chart not found"))
    for name in ("nb", "nb-gone", "nb-theirs"):
        states[name] = start_notebook(cluster, instance, name)
    sts = f"/apis/apps/v1/namespaces/{instance['namespace']}/statefulsets"
    cluster.delete(f"{sts}/{ko.notebook_name('nb-gone')}")
    cluster.delete(f"{sts}/{ko.notebook_name('nb-theirs')}")  # a user of the namespace puts their own in its place
    cluster.post(sts, {"metadata": {"name": ko.notebook_name("nb-theirs"), "namespace": instance["namespace"]}})

    states["raycluster"] = start_ray(cluster, "vision", "ray-c")
    states["raycluster-gone"] = start_ray(cluster, "vision", "ray-cg")
    cluster.delete(ray_path("vision", "ray-cg", "RayCluster"))
    for name in ("run", "ok", "fail", "gone"):
        states[f"rayjob-{name}"] = start_ray(cluster, "vision", f"ray-{name}", entrypoint="python tune.py")
    ray_pods = f"/api/v1/namespaces/{kro.ray_namespace_name('vision', SETTINGS)}/pods"
    cluster.post(ray_pods, submitter_pod("vision", "ray-run"))
    cluster.respond(f"get {ray_pods}/{kro.cluster_name('ray-run')}-submit/log", b"trial 1\nPROGRESS 0.75\n")
    cluster.set_status(
        ray_path("vision", "ray-ok", "RayJob"), {"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED"}
    )
    message = "Job entrypoint command failed with exit code 3, last available logs (truncated to 20,000 chars):\nboom"
    ended = {"jobDeploymentStatus": "Failed", "jobStatus": "FAILED", "reason": "AppFailed"}
    cluster.set_status(ray_path("vision", "ray-fail", "RayJob"), ended | {"message": message})
    cluster.delete(ray_path("vision", "ray-gone", "RayJob"))
    return states


EXPECTED = {
    "job-run": (Status("running"), Progress(0.5, "PROGRESS 0.5")),
    "job-ok": (Status("exited", 0, "exited"), None),
    "job-fail": (Status("exited", 3, "replica 1 exited with code 3"), Progress(0.9, "PROGRESS 0.9")),
    "job-late": (Status("exited", TIMEOUT_EXIT_CODE, "killed by Kubernetes after exceeding its time limit"), None),
    "job-gone": (Status("exited", UNKNOWN_EXIT_CODE, "the Job was deleted before its end was seen"), None),
    "instance": (Status("running"), None),
    "instance-gone": (Status("exited", UNKNOWN_EXIT_CODE, "the namespace was deleted outside the portal"), None),
    "vcluster-failed": (Status("exited", 1, "the vcluster chart did not install: chart not found"), None),
    "nb": (Status("running", message="ready"), None),
    "nb-gone": (Status("exited", UNKNOWN_EXIT_CODE, "the notebook's StatefulSet was deleted outside the portal"), None),
    "nb-theirs": (
        Status("exited", UNKNOWN_EXIT_CODE, "the notebook's StatefulSet was deleted outside the portal"),
        None,
    ),
    "raycluster": (Status("running", message="ready"), None),
    "raycluster-gone": (
        Status("exited", UNKNOWN_EXIT_CODE, "the RayCluster was deleted before its end was seen"),
        None,
    ),
    "rayjob-run": (Status("running", message="ready"), Progress(0.75, "PROGRESS 0.75")),
    "rayjob-ok": (Status("exited", 0, "exited"), None),
    "rayjob-fail": (Status("exited", 3, "the Ray job's entrypoint exited with code 3"), None),
    "rayjob-gone": (Status("exited", UNKNOWN_EXIT_CODE, "the RayJob was deleted before its end was seen"), None),
}


def test_answers_within_a_pass_are_those_of_each_workload_asked_alone(cluster: Emulator) -> None:
    states = workloads_in_every_condition(cluster)
    requests = Requests(cluster)
    with backend(cluster).polling(states.values()):
        requests.since()
        batched = {name: _look(backend(cluster, state)) for name, state in states.items()}
        during, _ = requests.since()
    alone = {name: _look(backend(cluster, state)) for name, state in states.items()}

    assert batched == alone
    assert batched == EXPECTED
    # Within the pass nothing was read but the logs progress is read from (ended workloads deleted what they no
    # longer need): the objects and the pods came from the pass's lists.
    ray_pods = f"/api/v1/namespaces/{kro.ray_namespace_name('vision', SETTINGS)}/pods"
    assert {path for (method, path), _ in during.items() if method == "GET"} == {
        f"/api/v1/namespaces/{jobs_ns('vision')}/pods/{ko.job_name('job-run')}-0-x/log",
        f"/api/v1/namespaces/{jobs_ns('vision')}/pods/{ko.job_name('job-fail')}-0-x/log",
        f"{ray_pods}/{kro.cluster_name('ray-run')}-submit/log",
    }
    assert {method for method, _ in during} == {"GET", "DELETE"}


def _look(k8s: KubernetesBackend) -> tuple[Status, Progress | None]:
    """What a reconcile pass asks a workload's backend (apps/workloads/host.py's ``_look``)."""
    return k8s.poll(), k8s.progress()


# -- one client per API server ------------------------------------------------------------------------------------


def test_the_backends_of_one_api_server_share_one_api_client(cluster: Emulator) -> None:
    connection = {"host": cluster.url}
    first, second = (backend_for(SimpleNamespace(kind="kubernetes", connection=connection)) for _ in range(2))
    assert isinstance(first, KubernetesBackend) and isinstance(second, KubernetesBackend)
    assert first._api_client() is second._api_client()
    other = backend_for(SimpleNamespace(kind="kubernetes", connection={"host": cluster.url + "/other"}))
    assert isinstance(other, KubernetesBackend) and other._api_client() is not first._api_client()


# -- through the workload host ------------------------------------------------------------------------------------


def test_a_reconcile_pass_over_kubernetes_jobs_lists_each_namespace_once(world: World, cluster: Emulator) -> None:
    k8s = Cluster.objects.create(name="k8s", kind=Cluster.Kind.KUBERNETES, connection={"host": cluster.url})
    rows = []
    for n, workspace in enumerate([world.team_a] * 6 + [world.team_b] * 4):
        state = submit_job(cluster, workspace.name, f"job-{n}")
        rows.append(
            Job.objects.create(
                workspace=workspace, name=f"train-{n}", command="python train.py", state=Job.State.RUNNING,
                cluster=k8s, backend_state=state,
            ).pk
        )  # fmt: skip
    cluster.set_status(job_path(world.team_b.name, "job-9"), {"conditions": [{"type": "Complete", "status": "True"}]})
    requests = Requests(cluster)

    counts = reconcile(sweep=False)

    assert counts["converged"] == 10 and counts["failed"] == 0
    assert [Job.objects.get(pk=pk).state for pk in rows] == [Job.State.RUNNING] * 9 + [Job.State.SUCCEEDED]
    gets = Counter(path for (method, path), n in requests.since()[0].items() for _ in range(n) if method == "GET")
    assert gets == Counter(
        f"{prefix}/namespaces/{jobs_ns(workspace.name)}/{plural}"
        for workspace in (world.team_a, world.team_b)
        for prefix, plural in (("/apis/batch/v1", "jobs"), ("/api/v1", "pods"))
    )
