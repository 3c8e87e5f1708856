"""The Kubernetes backend's call flows, through the official client over HTTP against kmock's API emulator.

No kube-apiserver can run on these machines: the emulator stores what it is sent and answers 409 and 404
as the API server does, and the tests play the controllers' part (writing status, creating pods, filling a
token). Admission, quota and the controllers themselves are not exercised here.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from tests.backends.kmock_cluster import Emulator, running_emulator
from tests.backends.test_kubernetes_isolation import Pod, ingress_allowed, restricted_violations
from workers.backends import BackendError, JobSpec, PolicyRefusal, Status
from workers.backends import kubernetes_objects as ko
from workers.backends import kubernetes_vcluster as kv
from workers.backends.base import InstanceSpec, NotebookSpec
from workers.backends.kubernetes import KubernetesBackend, _workload_name
from workers.backends.registry import backend_for

SETTINGS = ko.KubeSettings(ingress_mode="path", ingress_host="portal.example.org", username_prefix="oidc:")


@pytest.fixture
def cluster() -> Iterator[Emulator]:
    with running_emulator() as emulator:
        yield emulator


def backend(cluster: Emulator, **options: Any) -> KubernetesBackend:
    options = {"start_timeout_s": 5.0, "stop_timeout_s": 5.0, "poll_interval_s": 0.01, **options}
    return KubernetesBackend(settings=SETTINGS, host=cluster.url, server_url="https://k8s.example.org:6443", **options)


def instance_spec(kind: str = "namespace", users: list[str] | None = None) -> InstanceSpec:
    return InstanceSpec(
        key="instance-1",
        workspace="vision",
        name="dev",
        work_dir="/unused",
        kind=kind,
        devices=["0", "1"],
        gpu_type="h100",
        gpus=2,
        cpu_cores=8,
        memory_gb=64,
        users=users if users is not None else ["alice", "bob"],
    )


def job_spec(replicas: int = 2, **overrides: Any) -> JobSpec:
    fields: dict[str, Any] = {
        "key": "job-7",
        "workspace": "vision",
        "name": "train",
        "command": "python train.py",
        "work_dir": "/unused",
        "image": "pytorch/pytorch:2.5.1",
        "env": {"EPOCHS": "3"},
        "replicas": replicas,
        "devices": [["0"], ["1"]][:replicas],
        "cpu_cores": 4,
        "memory_gb": 16,
        "max_runtime_s": 600,
    }
    return JobSpec(**(fields | overrides))


NS = ko.namespace_name(ko.Owner("vision", "dev"), SETTINGS)
JOBS_NS = ko.jobs_namespace_name("vision", SETTINGS)
JOB = ko.job_name(_workload_name("job-7"))
JOB_PATH = f"/apis/batch/v1/namespaces/{JOBS_NS}/jobs/{JOB}"


def fill_token(cluster: Emulator) -> None:
    """What the token controller does to a service-account-token Secret."""
    data = {"token": base64.b64encode(b"s3cret-token").decode(), "ca.crt": base64.b64encode(b"PEM").decode()}
    cluster.patch(f"/api/v1/namespaces/{NS}/secrets/gpuportal-user-token", {"data": data})


# -- instances --------------------------------------------------------------------------------------------


def test_it_creates_a_namespace_instance_and_creating_it_again_converges(cluster: Emulator) -> None:
    k8s = backend(cluster)
    endpoint = k8s.start(instance_spec())
    assert (endpoint.host, endpoint.port, endpoint.url) == ("k8s.example.org", 6443, "https://k8s.example.org:6443")
    namespace = cluster.get(f"/api/v1/namespaces/{NS}")
    assert namespace is not None and namespace["metadata"]["labels"][ko.LABEL_WORKSPACE] == "vision"
    quota = cluster.get(f"/api/v1/namespaces/{NS}/resourcequotas/gpuportal-quota")
    assert quota is not None
    assert quota["spec"]["hard"]["requests.nvidia.com/gpu"] == "2"
    assert quota["spec"]["hard"]["limits.cpu"] == "8" and quota["spec"]["hard"]["limits.memory"] == "64Gi"
    for path in (
        f"/api/v1/namespaces/{NS}/limitranges/gpuportal-limits",
        f"/apis/networking.k8s.io/v1/namespaces/{NS}/networkpolicies/gpuportal-isolate",
        f"/api/v1/namespaces/{NS}/serviceaccounts/gpuportal-user",
        f"/api/v1/namespaces/{NS}/secrets/gpuportal-user-token",
    ):
        assert cluster.get(path) is not None, path
    binding_path = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{NS}/rolebindings/gpuportal-edit"
    binding = cluster.get(binding_path)
    assert binding is not None
    assert [s["name"] for s in binding["subjects"] if s["kind"] == "User"] == ["oidc:alice", "oidc:bob"]

    # The same backend again, then a new one without state: every create is a 409, and the objects converge.
    assert k8s.start(instance_spec()) == endpoint
    again = backend(cluster)
    assert again.start(instance_spec(users=["alice", "carol"])) == endpoint
    assert cluster.requests_to("post", f"/api/v1/namespaces/{NS}/resourcequotas") == 3
    binding = cluster.get(binding_path)
    assert binding is not None
    assert [s["name"] for s in binding["subjects"] if s["kind"] == "User"] == ["oidc:alice", "oidc:carol"]
    assert again.poll() == Status("running")


def test_the_kubeconfig_holds_the_namespace_token_once_it_is_issued(cluster: Emulator) -> None:
    k8s = backend(cluster)
    k8s.start(instance_spec())
    with pytest.raises(BackendError) as pending:
        k8s.kubeconfig()
    assert not pending.value.permanent
    fill_token(cluster)
    config = yaml.safe_load(k8s.kubeconfig() or "")
    (entry,) = config["clusters"]
    assert entry["cluster"] == {
        "server": "https://k8s.example.org:6443",
        "certificate-authority-data": base64.b64encode(b"PEM").decode(),
    }
    assert config["users"][0]["user"] == {"token": "s3cret-token"}
    (context,) = config["contexts"]
    assert context["context"]["namespace"] == NS and config["current-context"] == context["name"]


def test_stopping_an_instance_deletes_its_namespace_and_stopping_again_is_harmless(cluster: Emulator) -> None:
    k8s = backend(cluster)
    k8s.start(instance_spec())
    saved = k8s.get_state()
    k8s.stop()
    assert cluster.get(f"/api/v1/namespaces/{NS}") is None
    assert k8s.poll() == Status("exited", 0, "stopped on request")
    # Another worker that still had the state before the stop: the delete is a 404, which is done.
    reattached = backend(cluster)
    reattached.load_state(saved)
    reattached.stop()
    assert cluster.requests_to("delete", f"/api/v1/namespaces/{NS}") == 2
    assert reattached.poll().exit_code == 0


def test_an_instance_whose_namespace_vanished_has_exited(cluster: Emulator) -> None:
    k8s = backend(cluster)
    k8s.start(instance_spec())
    cluster.delete(f"/api/v1/namespaces/{NS}")
    status = k8s.poll()
    assert status.state == "exited" and "namespace" in status.message


def test_a_vcluster_instance_is_its_host_namespace_and_a_helm_installer(cluster: Emulator) -> None:
    k8s = backend(cluster, vcluster_server_url="https://{release}.vc.example.org")
    endpoint = k8s.start(instance_spec(kind="vcluster"))
    assert endpoint.url == "https://vc-dev.vc.example.org"
    assert cluster.get(f"/api/v1/namespaces/{NS}/resourcequotas/gpuportal-quota") is not None
    assert cluster.get(f"/apis/rbac.authorization.k8s.io/v1/namespaces/{NS}/rolebindings/gpuportal-edit") is None
    values = cluster.get(f"/api/v1/namespaces/{NS}/configmaps/{kv.VCLUSTER_INSTALLER}")
    assert values is not None
    assert yaml.safe_load(values["data"]["values.yaml"])["exportKubeConfig"]["server"] == endpoint.url
    installer_path = f"/apis/batch/v1/namespaces/{NS}/jobs/{kv.VCLUSTER_INSTALLER}"
    installer = cluster.get(installer_path)
    assert installer is not None and installer["spec"]["template"]["spec"]["containers"][0]["command"][0] == "helm"
    assert k8s.poll().running

    # The chart writes the vcluster's kubeconfig to a Secret; the backend hands it out as it is.
    config = "apiVersion: v1\nkind: Config\nclusters: []\n"
    secret = {"metadata": {"name": "vc-dev-kubeconfig", "namespace": NS}, "data": {"config": _b64(config)}}
    cluster.post(f"/api/v1/namespaces/{NS}/secrets", secret)
    assert k8s.kubeconfig() == config

    failed = {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded", "message": "chart not found"}
    cluster.set_status(installer_path, {"conditions": [failed]})
    assert k8s.poll() == Status("exited", 1, "the vcluster chart did not install: chart not found")


def test_it_refuses_instance_kinds_it_cannot_run(cluster: Emulator) -> None:
    with pytest.raises(BackendError) as refused:
        backend(cluster).start(instance_spec(kind="slice"))
    assert refused.value.permanent
    assert cluster.get(f"/api/v1/namespaces/{NS}") is None


# -- notebooks --------------------------------------------------------------------------------------------


def notebook_spec(instance_state: dict[str, Any], **overrides: Any) -> NotebookSpec:
    fields: dict[str, Any] = dict(
        key="notebook-3",
        workspace="vision",
        name="lab",
        work_dir="/unused",
        base_url="/notebooks/vision/lab/",
        token="t0k3n",
        image="quay.io/jupyter/scipy-notebook:2025-01-01",
        devices=["0", "1"],
        cpu_cores=2,
        memory_gb=8,
        instance_state=instance_state,
    )
    return NotebookSpec(**(fields | overrides))


def test_a_notebook_runs_in_its_instances_namespace_and_stops(cluster: Emulator) -> None:
    instance = backend(cluster)
    instance.start(instance_spec())
    k8s = backend(cluster)
    sts_path = f"/apis/apps/v1/namespaces/{NS}/statefulsets/nb-lab"
    ready = cluster.when(sts_path, lambda obj: True, lambda: cluster.set_status(sts_path, {"readyReplicas": 1}))
    endpoint = k8s.start(notebook_spec(instance.get_state()))
    ready.join()
    assert endpoint.host == f"nb-lab.{NS}.svc" and endpoint.port == ko.JUPYTER_PORT
    assert endpoint.url == "http://portal.example.org/notebooks/vision/lab/"
    stateful_set = cluster.get(sts_path)
    assert stateful_set is not None
    container = stateful_set["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "quay.io/jupyter/scipy-notebook:2025-01-01"
    assert "--ServerApp.base_url=/notebooks/vision/lab/" in container["command"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "2"
    secret = cluster.get(f"/api/v1/namespaces/{NS}/secrets/nb-lab-token")
    assert secret is not None and secret["stringData"] == {"token": "t0k3n"}
    ingress = cluster.get(f"/apis/networking.k8s.io/v1/namespaces/{NS}/ingresses/nb-lab")
    assert ingress is not None and ingress["spec"]["rules"][0]["host"] == "portal.example.org"
    assert k8s.poll() == Status("running", message="ready")

    cluster.respond(f"get /api/v1/namespaces/{NS}/pods/nb-lab-0/log", b"[I] Jupyter Server is running\n")
    assert k8s.logs(0) == (b"[I] Jupyter Server is running\n", 30)
    assert k8s.logs(0, 30) == (b"", 30)

    k8s.stop()
    for path in (sts_path, f"/api/v1/namespaces/{NS}/services/nb-lab", f"/api/v1/namespaces/{NS}/secrets/nb-lab-token"):
        assert cluster.get(path) is None, path
    assert cluster.get(f"/api/v1/namespaces/{NS}") is not None  # the instance stays


def test_a_notebook_that_never_gets_ready_is_deleted_and_the_start_fails(cluster: Emulator) -> None:
    instance = backend(cluster)
    instance.start(instance_spec())
    k8s = backend(cluster, start_timeout_s=0.2)
    with pytest.raises(BackendError) as late:
        k8s.start(notebook_spec(instance.get_state()))
    assert not late.value.permanent and "not ready" in late.value.message
    assert cluster.get(f"/apis/apps/v1/namespaces/{NS}/statefulsets/nb-lab") is None
    assert k8s.poll().state == "exited"


def test_a_notebook_needs_its_instances_namespace(cluster: Emulator) -> None:
    with pytest.raises(BackendError) as refused:
        backend(cluster).start(notebook_spec({}))
    assert refused.value.permanent


# -- jobs -------------------------------------------------------------------------------------------------


def release_gang(cluster: Emulator, replicas: int = 2) -> Any:
    """The Job controller's part: once the Job is released, its pods come up ready."""
    return cluster.when(
        JOB_PATH,
        lambda job: job["spec"]["suspend"] is False,
        lambda: cluster.set_status(JOB_PATH, {"active": replicas, "ready": replicas}),
    )


def job_pod(index: int, exit_code: int | None = None, finished_at: str = "") -> dict[str, Any]:
    labels = {"batch.kubernetes.io/job-name": JOB, "batch.kubernetes.io/job-completion-index": str(index)}
    pod: dict[str, Any] = {"metadata": {"name": f"{JOB}-{index}-abcde", "namespace": JOBS_NS, "labels": labels}}
    if exit_code is not None:
        terminated = {"exitCode": exit_code, "finishedAt": finished_at}
        pod["status"] = {"containerStatuses": [{"name": "main", "state": {"terminated": terminated}}]}
    return pod


def test_a_job_is_created_suspended_and_released_on_start(cluster: Emulator) -> None:
    k8s = backend(cluster)
    k8s.submit(job_spec())
    job = cluster.get(JOB_PATH)
    assert job is not None and job["spec"]["suspend"] is True
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == 2
    assert cluster.get(f"/api/v1/namespaces/{JOBS_NS}/services/{JOB}") is not None
    assert cluster.get(f"/api/v1/namespaces/{JOBS_NS}") is not None

    controller = release_gang(cluster)
    endpoint = k8s.start(job_spec())
    controller.join()
    job = cluster.get(JOB_PATH)
    assert job is not None and job["spec"]["suspend"] is False
    assert endpoint.host == f"{JOB}-0.{JOB}.{JOBS_NS}.svc" and endpoint.port == SETTINGS.master_port
    env = {
        e["name"]: e.get("value", e.get("valueFrom")) for e in job["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert env["WORLD_SIZE"] == "2" and env["PORTAL_JOB_KEY"] == "job-7" and env["EPOCHS"] == "3"
    assert env["RANK"] == {"fieldRef": {"fieldPath": f"metadata.annotations['{ko.JOB_INDEX_ANNOTATION}']"}}
    assert job["spec"]["activeDeadlineSeconds"] == 600
    assert k8s.poll() == Status("running")
    # Starting it again leaves the released Job alone: the only patches it ever got are releases.
    assert k8s.start(job_spec()) == endpoint
    assert cluster.bodies("patch", JOB_PATH) == [ko.job_release_patch()] * 2

    # A new worker reattaches from the state and sees the Job complete; the gang's Service goes then.
    reattached = backend(cluster)
    reattached.load_state(k8s.get_state())
    cluster.set_status(JOB_PATH, {"conditions": [{"type": "Complete", "status": "True"}], "succeeded": 2})
    assert reattached.poll() == Status("exited", 0, "exited")
    assert cluster.get(f"/api/v1/namespaces/{JOBS_NS}/services/{JOB}") is None
    assert cluster.get(JOB_PATH) is not None  # kept for its logs until its TTL
    assert reattached.poll() == Status("exited", 0, "exited")


def test_a_failed_job_reports_the_first_failed_replicas_exit_code(cluster: Emulator) -> None:
    k8s = backend(cluster)
    controller = release_gang(cluster)
    k8s.start(job_spec())
    controller.join()
    cluster.post(f"/api/v1/namespaces/{JOBS_NS}/pods", job_pod(0, exit_code=143, finished_at="2026-01-01T00:00:09Z"))
    cluster.post(f"/api/v1/namespaces/{JOBS_NS}/pods", job_pod(1, exit_code=3, finished_at="2026-01-01T00:00:05Z"))
    failed = {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}
    cluster.set_status(JOB_PATH, {"conditions": [failed], "failed": 2})
    assert k8s.poll() == Status("exited", 3, "replica 1 exited with code 3")


def test_a_job_past_its_deadline_exits_with_the_timeout_code(cluster: Emulator) -> None:
    k8s = backend(cluster)
    controller = release_gang(cluster)
    k8s.start(job_spec())
    controller.join()
    failed = {"type": "Failed", "status": "True", "reason": "DeadlineExceeded"}
    cluster.set_status(JOB_PATH, {"conditions": [failed]})
    assert k8s.poll().exit_code == 124


def test_it_reads_a_replicas_log_and_its_progress(cluster: Emulator) -> None:
    k8s = backend(cluster)
    controller = release_gang(cluster)
    k8s.start(job_spec())
    controller.join()
    assert k8s.logs(1) == (b"", 0)  # no pod yet
    cluster.post(f"/api/v1/namespaces/{JOBS_NS}/pods", job_pod(0))
    cluster.post(f"/api/v1/namespaces/{JOBS_NS}/pods", job_pod(1))
    cluster.respond(f"get /api/v1/namespaces/{JOBS_NS}/pods/{JOB}-1-abcde/log", b"rank 1\n")
    cluster.respond(
        f"get /api/v1/namespaces/{JOBS_NS}/pods/{JOB}-0-abcde/log", b"PROGRESS 0.25\nloss 1\nPROGRESS 0.5\n"
    )
    assert k8s.logs(1) == (b"rank 1\n", 7)
    assert k8s.logs(1, 5) == (b"1\n", 7)
    progress = k8s.progress()
    assert progress is not None and progress.fraction == 0.5 and progress.line == "PROGRESS 0.5"
    with pytest.raises(BackendError) as missing:
        k8s.logs(2)
    assert missing.value.permanent


def test_stopping_a_job_deletes_it_and_stopping_again_is_harmless(cluster: Emulator) -> None:
    k8s = backend(cluster)
    controller = release_gang(cluster)
    k8s.start(job_spec())
    controller.join()
    saved = k8s.get_state()
    k8s.stop()
    assert cluster.get(JOB_PATH) is None
    assert cluster.get(f"/api/v1/namespaces/{JOBS_NS}/services/{JOB}") is None
    assert cluster.get(f"/api/v1/namespaces/{JOBS_NS}") is not None  # the workspace's jobs namespace stays
    assert k8s.poll() == Status("exited", 143, "stopped on request")
    reattached = backend(cluster)
    reattached.load_state(saved)
    reattached.stop()
    assert cluster.requests_to("delete", JOB_PATH) == 2


def test_a_gang_that_does_not_start_in_time_is_deleted(cluster: Emulator) -> None:
    k8s = backend(cluster, start_timeout_s=0.2)
    with pytest.raises(BackendError) as late:
        k8s.start(job_spec())
    assert not late.value.permanent
    assert cluster.get(JOB_PATH) is None


def test_a_finished_job_of_an_earlier_run_is_removed_before_a_new_start(cluster: Emulator) -> None:
    first = backend(cluster)
    first.submit(job_spec())
    cluster.set_status(JOB_PATH, {"conditions": [{"type": "Complete", "status": "True"}]})
    with pytest.raises(BackendError) as retry:
        backend(cluster).start(job_spec())
    assert not retry.value.permanent
    assert cluster.get(JOB_PATH) is None


def test_it_refuses_env_that_the_gang_sets(cluster: Emulator) -> None:
    with pytest.raises(PolicyRefusal):
        backend(cluster).start(job_spec(env={"RANK": "3"}))
    assert cluster.get(JOB_PATH) is None


# -- isolation --------------------------------------------------------------------------------------------

NETWORK_POLICIES = "/apis/networking.k8s.io/v1/namespaces/{}/networkpolicies/{}"


def stored_policies(cluster: Emulator, namespace: str, *names: str) -> list[dict[str, Any]]:
    """The NetworkPolicies as the API server got them through the client."""
    policies = [cluster.get(NETWORK_POLICIES.format(namespace, name)) for name in names]
    assert all(p is not None for p in policies), names
    return [p for p in policies if p is not None]


def assert_restricted_namespace(cluster: Emulator, namespace: str) -> None:
    stored = cluster.get(f"/api/v1/namespaces/{namespace}")
    assert stored is not None
    labels = stored["metadata"]["labels"]
    for mode in ("enforce", "audit", "warn"):
        assert labels[f"pod-security.kubernetes.io/{mode}"] == "restricted"
        assert labels[f"pod-security.kubernetes.io/{mode}-version"] == "latest"


def test_an_instance_namespace_is_restricted_and_closed_to_other_namespaces(cluster: Emulator) -> None:
    backend(cluster).start(instance_spec())
    assert_restricted_namespace(cluster, NS)
    policies = stored_policies(cluster, NS, ko.NETWORK_POLICY_ISOLATE, ko.NETWORK_POLICY_NOTEBOOK_INGRESS)
    notebook_labels = ko.portal_labels(ko.Owner("vision", "dev"), "notebook", "lab")
    notebook, users_pod = Pod(NS, notebook_labels), Pod(NS, {"app": "mine"})
    assert ingress_allowed(policies, users_pod, notebook, ko.JUPYTER_PORT)
    assert ingress_allowed(policies, Pod(SETTINGS.ingress_namespace), notebook, ko.JUPYTER_PORT)
    assert not ingress_allowed(policies, Pod(SETTINGS.ingress_namespace), users_pod, ko.JUPYTER_PORT)
    other = ko.namespace_name(ko.Owner("other", "dev"), SETTINGS)
    assert not ingress_allowed(policies, Pod(other, notebook_labels), notebook, ko.JUPYTER_PORT)
    account = cluster.get(f"/api/v1/namespaces/{NS}/serviceaccounts/{ko.service_account_name()}")
    assert account is not None and account["automountServiceAccountToken"] is False


@pytest.mark.parametrize("asks", [False, True])
def test_a_notebooks_pod_is_restricted_and_mounts_a_token_only_if_asked(cluster: Emulator, asks: bool) -> None:
    instance = backend(cluster)
    instance.start(instance_spec())
    sts_path = f"/apis/apps/v1/namespaces/{NS}/statefulsets/nb-lab"
    ready = cluster.when(sts_path, lambda obj: True, lambda: cluster.set_status(sts_path, {"readyReplicas": 1}))
    backend(cluster).start(notebook_spec(instance.get_state(), service_account_token=asks))
    ready.join()
    stateful_set = cluster.get(sts_path)
    assert stateful_set is not None
    pod = stateful_set["spec"]["template"]["spec"]
    assert restricted_violations(pod) == []
    assert pod["securityContext"]["runAsUser"] == 1000 and pod["securityContext"]["fsGroup"] == 100
    assert pod["automountServiceAccountToken"] is asks
    # Asked for, it is the namespace's own account: the rights the workspace's kubeconfig already gives.
    assert pod.get("serviceAccountName") == (ko.service_account_name() if asks else None)


@pytest.mark.parametrize("asks", [False, True])
def test_a_jobs_pods_are_restricted_and_mount_a_token_only_if_asked(cluster: Emulator, asks: bool) -> None:
    backend(cluster).submit(job_spec(service_account_token=asks))
    job = cluster.get(JOB_PATH)
    assert job is not None
    pod = job["spec"]["template"]["spec"]
    assert restricted_violations(pod) == []
    assert pod["automountServiceAccountToken"] is asks
    assert pod.get("serviceAccountName") == ("default" if asks else None)
    assert_restricted_namespace(cluster, JOBS_NS)
    policies = stored_policies(cluster, JOBS_NS, ko.NETWORK_POLICY_ISOLATE)
    rank = Pod(JOBS_NS, job["spec"]["template"]["metadata"]["labels"])
    assert ingress_allowed(policies, rank, rank, SETTINGS.master_port)
    for stranger in (Pod(NS), Pod(SETTINGS.ingress_namespace), Pod(ko.jobs_namespace_name("other", SETTINGS))):
        assert not ingress_allowed(policies, stranger, rank, SETTINGS.master_port)


def test_a_jobs_namespace_made_by_an_earlier_portal_is_brought_to_restricted(cluster: Emulator) -> None:
    # An earlier version enforced baseline and let the ingress controller's namespace reach every job pod.
    labels = ko.portal_labels(ko.jobs_owner("vision", SETTINGS), "namespace", "")
    old_labels = labels | {"pod-security.kubernetes.io/enforce": "baseline"}
    cluster.post("/api/v1/namespaces", {"metadata": {"name": JOBS_NS, "labels": old_labels}})
    ingress_peer = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ingress-nginx"}}}
    old_policy = {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": ko.NETWORK_POLICY_ISOLATE, "namespace": JOBS_NS, "labels": labels},
        "spec": {
            "podSelector": {},
            "policyTypes": ["Ingress"],
            "ingress": [{"from": [{"podSelector": {}}, ingress_peer]}],
        },
    }
    cluster.post(f"/apis/networking.k8s.io/v1/namespaces/{JOBS_NS}/networkpolicies", old_policy)
    backend(cluster).submit(job_spec())
    assert_restricted_namespace(cluster, JOBS_NS)
    policies = stored_policies(cluster, JOBS_NS, ko.NETWORK_POLICY_ISOLATE)
    assert not ingress_allowed(policies, Pod("ingress-nginx"), Pod(JOBS_NS), SETTINGS.master_port)


def test_a_vcluster_and_its_installer_are_restricted(cluster: Emulator) -> None:
    backend(cluster).start(instance_spec(kind="vcluster"))
    assert_restricted_namespace(cluster, NS)
    installer = cluster.get(f"/apis/batch/v1/namespaces/{NS}/jobs/{kv.VCLUSTER_INSTALLER}")
    assert installer is not None
    pod = installer["spec"]["template"]["spec"]
    assert restricted_violations(pod) == []
    assert pod["automountServiceAccountToken"] is True and pod["serviceAccountName"] == kv.VCLUSTER_INSTALLER
    account = cluster.get(f"/api/v1/namespaces/{NS}/serviceaccounts/{kv.VCLUSTER_INSTALLER}")
    assert account is not None and account["automountServiceAccountToken"] is False
    values_map = cluster.get(f"/api/v1/namespaces/{NS}/configmaps/{kv.VCLUSTER_INSTALLER}")
    assert values_map is not None
    values = yaml.safe_load(values_map["data"]["values.yaml"])
    plane = values["controlPlane"]["statefulSet"]["security"]
    assert plane["podSecurityContext"]["runAsNonRoot"] is True
    assert plane["containerSecurityContext"]["runAsUser"] == 1000
    policies = stored_policies(cluster, NS, ko.NETWORK_POLICY_ISOLATE, kv.NETWORK_POLICY_VCLUSTER_INGRESS)
    control_plane = Pod(NS, {"app": "vcluster", "release": "vc-dev"})
    assert ingress_allowed(policies, Pod(SETTINGS.ingress_namespace), control_plane, 8443)
    assert not ingress_allowed(policies, Pod(JOBS_NS), control_plane, 8443)


def test_it_refuses_connection_settings_that_would_run_pods_as_root() -> None:
    for bad, field_name in [
        ({"pod_run_as_user": 0}, "pod_run_as_user"),
        ({"pod_fs_group": 0}, "pod_fs_group"),
        ({"pod_run_as_group": True}, "pod_run_as_group"),
        ({"pod_security_version": "1.37"}, "pod_security_version"),
        ({"ingress_namespace": "not a namespace"}, "ingress_namespace"),
    ]:
        with pytest.raises(BackendError) as refused:
            backend_for(SimpleNamespace(kind="kubernetes", connection=bad))
        assert refused.value.permanent and field_name in refused.value.message
    configured = backend_for(
        SimpleNamespace(kind="kubernetes", connection={"pod_run_as_user": 2000, "pod_security_version": "v1.37"})
    )
    assert isinstance(configured, KubernetesBackend)
    assert configured.settings.pod_run_as_user == 2000


# -- errors -----------------------------------------------------------------------------------------------


def test_a_server_error_is_transient(cluster: Emulator) -> None:
    cluster.respond(f"post /apis/batch/v1/namespaces/{JOBS_NS}/jobs", 500)
    with pytest.raises(BackendError) as failed:
        backend(cluster).start(job_spec())
    assert not failed.value.permanent and "500" in failed.value.message


def test_an_exceeded_quota_is_a_policy_refusal_with_the_api_servers_message(cluster: Emulator) -> None:
    message = 'services "nb-lab" is forbidden: exceeded quota: gpuportal-quota, requested: services=1'
    status = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Forbidden", "code": 403}
    cluster.respond(f"post /api/v1/namespaces/{NS}/services", 403, status | {"message": message})
    instance = backend(cluster)
    instance.start(instance_spec())
    with pytest.raises(PolicyRefusal, match="exceeded quota: gpuportal-quota"):
        backend(cluster).start(notebook_spec(instance.get_state()))


def test_an_invalid_object_is_a_permanent_error(cluster: Emulator) -> None:
    status = {"kind": "Status", "status": "Failure", "reason": "Invalid", "code": 422, "message": "spec: Invalid"}
    cluster.respond(f"post /apis/batch/v1/namespaces/{JOBS_NS}/jobs", 422, status)
    with pytest.raises(BackendError) as failed:
        backend(cluster).start(job_spec())
    assert failed.value.permanent and "spec: Invalid" in failed.value.message


def test_an_unreachable_api_server_is_transient() -> None:
    k8s = KubernetesBackend(host="http://127.0.0.1:9", request_timeout_s=2)
    with pytest.raises(BackendError) as failed:
        k8s.discover()
    assert not failed.value.permanent


def test_an_existing_object_that_is_not_the_portals_is_left_alone(cluster: Emulator) -> None:
    cluster.post("/api/v1/namespaces", {"metadata": {"name": NS, "labels": {"team": "other"}}})
    with pytest.raises(BackendError) as refused:
        backend(cluster).start(instance_spec())
    assert refused.value.permanent
    assert cluster.get(f"/api/v1/namespaces/{NS}") == {"metadata": {"name": NS, "labels": {"team": "other"}}}


def test_an_object_still_being_deleted_makes_the_create_transient(cluster: Emulator) -> None:
    k8s = backend(cluster)
    k8s.start(instance_spec())
    cluster.patch(f"/api/v1/namespaces/{NS}", {"metadata": {"finalizers": ["kubernetes"]}})
    cluster.delete(f"/api/v1/namespaces/{NS}")  # held by its finalizer, as while its content goes
    with pytest.raises(BackendError) as busy:
        backend(cluster).start(instance_spec())
    assert not busy.value.permanent and "being deleted" in busy.value.message


# -- state, inventory, registry ---------------------------------------------------------------------------


def test_it_refuses_a_state_it_cannot_read() -> None:
    with pytest.raises(BackendError) as unreadable:
        KubernetesBackend().load_state({"version": 99, "kind": "job", "namespace": "x"})
    assert unreadable.value.permanent
    KubernetesBackend().load_state({})


def test_it_discovers_gpus_from_node_allocatable_and_labels(cluster: Emulator) -> None:
    for name, gpus, labels in [
        ("gpu-b", "2", {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.memory": "81559"}),
        ("cpu-a", None, {}),
        ("gpu-a", "1", {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB"}),
    ]:
        allocatable = {"cpu": "32"} | ({"nvidia.com/gpu": gpus} if gpus else {})
        cluster.post(
            "/api/v1/nodes", {"metadata": {"name": name, "labels": labels}, "status": {"allocatable": allocatable}}
        )
    gpus = backend(cluster).discover()
    assert [(g.index, g.name, g.memory_mb) for g in gpus] == [
        ("gpu-a:0", "NVIDIA-A100-SXM4-40GB", 0),
        ("gpu-b:0", "NVIDIA-H100-80GB-HBM3", 81559),
        ("gpu-b:1", "NVIDIA-H100-80GB-HBM3", 81559),
    ]


def test_the_registry_configures_it_from_the_clusters_connection() -> None:
    connection = {"host": "https://k8s.internal:6443", "namespace_prefix": "lab", "ingress_mode": "host"}
    k8s = backend_for(SimpleNamespace(kind="kubernetes", connection=connection | {"ingress_host": "nb.example.org"}))
    assert isinstance(k8s, KubernetesBackend)
    assert k8s.host == "https://k8s.internal:6443"
    assert k8s.settings.namespace_prefix == "lab" and k8s.settings.ingress_mode == "host"
    for bad in ({"namspace_prefix": "lab"}, {"master_port": "29500"}, {"ingress_mode": "both"}):
        with pytest.raises(BackendError) as refused:
            backend_for(SimpleNamespace(kind="kubernetes", connection=bad))
        assert refused.value.permanent


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()
