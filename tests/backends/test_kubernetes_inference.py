"""Inference endpoints on the Kubernetes backend: a Pod per replica, a headless Service per endpoint.

No real API server can run here. The manifests are validated against the Kubernetes 1.37 schemas (strict) and
checked for what schemas cannot see (the key only in a Secret, no service-account token, "restricted", the
Service's selector, the NetworkPolicies); the readiness probe's script runs for real against an HTTP server that
wants the key; the flows go through the official client over HTTP to kmock's API emulator, with the tests
playing the kubelet's part (writing a pod's status, serving its log).
"""

from __future__ import annotations

import http.server
import inspect
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from decimal import Decimal
from types import SimpleNamespace
from typing import Any

import kubernetes_validate
import pytest

from tests.backends.kmock_cluster import Emulator, running_emulator
from tests.backends.test_kubernetes_isolation import Pod, ingress_allowed, restricted_violations, selector_matches
from workers.backends import BackendError, PolicyRefusal, Status
from workers.backends import kubernetes_inference as ki
from workers.backends import kubernetes_objects as ko
from workers.backends.base import UNKNOWN_EXIT_CODE, InferenceSpec
from workers.backends.kubernetes import KubernetesBackend, _workload_name
from workers.backends.registry import backend_for

K8S_VERSION = "1.37.0"
SETTINGS = ko.KubeSettings(workspace_volume="gp-files-{workspace}")
SHARED = ko.KubeSettings(
    workspace_volume="gp-files-{workspace}",
    fractional_gpu_resource_name="nvidia.com/gpu.shared",
    gpu_type_node_label="gpuportal.io/gpu",
)
OWNER = ki.serve_owner("vision", SETTINGS)
NS = ki.serve_namespace_name("vision", SETTINGS)
KEY = "gpk_" + "9f" * 24
LONG = "x" * 40 + "-" + "y" * 22


def serve(name: str = "replica-1", endpoint: str = "12", server: str = "vllm", **overrides: Any) -> ki.ServeSpec:
    fields: dict[str, Any] = {
        "name": name,
        "endpoint": endpoint,
        "server": server,
        "image": "vllm/vllm-openai:v0.33.0" if server == "vllm" else "ghcr.io/example/llama-cpp-python:0.3.36",
        "model": "models/qwen-0.5b" if server == "vllm" else "models/tiny/tiny.gguf",
        "served_name": "qwen",
        "size": ko.Size(8, 32, Decimal(1), "h100") if server == "vllm" else ko.Size(2, 4),
        "api_key": KEY,
    }
    return ki.ServeSpec(**(fields | overrides))


def every_manifest() -> list[tuple[str, dict[str, Any]]]:
    cases = [(f"namespace-{o['kind']}", o) for o in ki.serve_namespace_objects("vision", SETTINGS)]
    cases += [(f"namespace-long-{o['kind']}", o) for o in ki.serve_namespace_objects(LONG, SETTINGS)]
    variants = {
        "vllm-gpu": (serve(extra_args=("--max-model-len", "4096")), SETTINGS),
        "llamacpp-cpu": (serve(server="llamacpp", extra_args=("--n_ctx", "4096")), SETTINGS),
        "vllm-shared-gpu": (serve(size=ko.Size(4, 16, Decimal("0.5"), "h100")), SHARED),
        "long-names": (serve(name=LONG[:40], endpoint=LONG[:42]), SETTINGS),
    }
    for case, (spec, settings) in variants.items():
        owner = ki.serve_owner("vision", settings)
        cases += [(f"{case}-{o['kind']}", o) for o in ki.replica_objects(owner, spec, settings)]
        cases.append((f"{case}-Service", ki.endpoint_service(owner, spec.endpoint, settings)))
    return cases


CASES = every_manifest()


# -- the manifests ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("manifest", [m for _, m in CASES], ids=[i for i, _ in CASES])
def test_every_manifest_is_valid_against_the_kubernetes_schema(manifest: dict[str, Any]) -> None:
    kubernetes_validate.validate(manifest, K8S_VERSION, strict=True)
    assert manifest["metadata"]["labels"]["app.kubernetes.io/managed-by"] == ko.MANAGED_BY


def test_the_cases_above_cover_every_builder(monkeypatch: pytest.MonkeyPatch) -> None:
    # A builder added to the module must be added to every_manifest() too, and so gets checked.
    builders = [
        name
        for name, function in inspect.getmembers(ki, inspect.isfunction)
        if function.__module__ == ki.__name__
        and not name.startswith("_")
        and inspect.signature(function).return_annotation in ("Manifest", "list[Manifest]")
    ]
    assert len(builders) >= 8
    called: set[str] = set()
    for name in builders:
        function = getattr(ki, name)

        def record(*args: Any, _name: str = name, _function: Any = function, **kwargs: Any) -> Any:
            called.add(_name)
            return _function(*args, **kwargs)

        monkeypatch.setattr(ki, name, record)
    every_manifest()
    assert set(builders) - called == set()


def test_the_schema_check_catches_a_misplaced_field() -> None:
    pod = ki.replica_pod(OWNER, serve(), SETTINGS)
    pod["spec"]["containers"][0]["apiKey"] = KEY
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(pod, K8S_VERSION, strict=True)


@pytest.mark.parametrize("server", ["vllm", "llamacpp"])
def test_the_key_is_in_the_secret_only_and_the_server_and_its_probe_read_it_from_there(server: str) -> None:
    secret, pod = ki.replica_objects(OWNER, serve(server=server), SETTINGS)
    assert secret["kind"] == "Secret" and secret["stringData"] == {ki.API_KEY_KEY: KEY}
    assert KEY not in json.dumps(pod)
    container = pod["spec"]["containers"][0]
    key_env = {"vllm": "VLLM_API_KEY", "llamacpp": "API_KEY"}[server]  # the variable each server reads
    [from_secret] = [e for e in container["env"] if "valueFrom" in e]
    assert from_secret == {
        "name": key_env,
        "valueFrom": {"secretKeyRef": {"name": secret["metadata"]["name"], "key": ki.API_KEY_KEY}},
    }
    probe = container["readinessProbe"]["exec"]["command"]
    health = "/health" if server == "vllm" else "/v1/models"
    assert probe[:3] == ["python3", "-I", "-c"] and probe[-2:] == [health, key_env]


def test_a_replica_pod_is_restricted_and_mounts_no_service_account_token() -> None:
    for case, manifest in CASES:
        if manifest["kind"] == "Pod":
            assert manifest["spec"]["automountServiceAccountToken"] is False, case
            assert "serviceAccountName" not in manifest["spec"], case
            assert restricted_violations(manifest["spec"]) == [], case
            assert manifest["spec"]["restartPolicy"] == "Never", case  # the portal replaces a replica that ended


def test_the_server_listens_on_the_pods_port_with_servers_own_command() -> None:
    vllm = ki.replica_pod(OWNER, serve(extra_args=("--max-model-len", "4096")), SETTINGS)["spec"]["containers"][0]
    assert vllm["command"] == [
        "vllm", "serve", "/model/qwen-0.5b", "--host", "0.0.0.0", "--port", "8000",
        "--served-model-name", "qwen", "--max-model-len", "4096",
    ]  # fmt: skip
    assert {"name": "HF_HUB_OFFLINE", "value": "1"} in vllm["env"]
    llama = ki.replica_pod(OWNER, serve(server="llamacpp"), SETTINGS)["spec"]["containers"][0]
    assert llama["command"] == [
        "python", "-I", "-u", "-m", "uvicorn", "--factory", "llama_cpp.server.app:create_app",
        "--host", "0.0.0.0", "--port", "8000", "--workers", "1", "--log-level", "info", "--no-access-log",
    ]  # fmt: skip
    assert {"name": "MODEL", "value": "/model/tiny.gguf"} in llama["env"]
    assert llama["ports"] == [{"name": "http", "containerPort": ki.SERVER_PORT, "protocol": "TCP"}]
    with pytest.raises(PolicyRefusal):  # servers.command's own checks: the portal decides where it listens
        ki.replica_pod(OWNER, serve(extra_args=("--port", "9000")), SETTINGS)


def test_a_replica_asks_for_its_size_and_gpus() -> None:
    limits = ki.replica_pod(OWNER, serve(), SETTINGS)["spec"]["containers"][0]["resources"]["limits"]
    assert limits == {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "1"}
    shared = ki.replica_pod(
        ki.serve_owner("vision", SHARED), serve(size=ko.Size(4, 16, Decimal("0.5"), "h100")), SHARED
    )
    assert shared["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu.shared"] == "2"
    assert shared["spec"]["nodeSelector"] == {"gpuportal.io/gpu": "h100"}
    with pytest.raises(ko.UnsupportedRequest):
        ki.replica_pod(OWNER, serve(size=ko.Size(4, 16, Decimal("0.5"), "h100")), SETTINGS)


def test_the_model_alone_is_mounted_read_only_from_the_workspaces_volume() -> None:
    pod = ki.replica_pod(OWNER, serve(), SETTINGS)
    [model] = [v for v in pod["spec"]["volumes"] if v["name"] == "model"]
    assert model["persistentVolumeClaim"] == {"claimName": ki.WORKSPACE_CLAIM, "readOnly": True}
    [mount] = [m for m in pod["spec"]["containers"][0]["volumeMounts"] if m["name"] == "model"]
    assert mount == {"name": "model", "mountPath": "/model/qwen-0.5b", "subPath": "models/qwen-0.5b", "readOnly": True}
    [claim] = [o for o in ki.serve_namespace_objects("vision", SETTINGS) if o["kind"] == "PersistentVolumeClaim"]
    assert claim["metadata"] == {"name": ki.WORKSPACE_CLAIM, "namespace": NS, "labels": claim["metadata"]["labels"]}
    # Bound to the admin's volume of this workspace by name, read-only, and never provisioned in its place.
    assert claim["spec"]["volumeName"] == "gp-files-vision" and claim["spec"]["storageClassName"] == ""
    assert claim["spec"]["accessModes"] == ["ReadOnlyMany"]
    for outside in ("../other/model", "/etc", "", ".", "models/../../x"):
        with pytest.raises(ValueError):
            ki.replica_pod(OWNER, serve(model=outside), SETTINGS)


def test_a_cluster_without_a_workspace_volume_serves_nothing() -> None:
    with pytest.raises(ko.UnsupportedRequest):
        ki.serve_namespace_objects("vision", ko.KubeSettings())
    with pytest.raises(ko.InvalidSettings):
        ko.KubeSettings(workspace_volume="one-volume-for-everyone")


def test_the_service_selects_that_endpoints_replicas_and_nothing_else() -> None:
    service = ki.endpoint_service(OWNER, "12", SETTINGS)
    assert service["metadata"]["name"] == "ep-12" and service["spec"]["clusterIP"] == "None"
    selector = {"matchLabels": service["spec"]["selector"]}

    def labels(owner: ko.Owner, spec: ki.ServeSpec) -> dict[str, str]:
        found: dict[str, str] = ki.replica_pod(owner, spec, SETTINGS)["metadata"]["labels"]
        return found

    other_workspace = ki.serve_owner("other", SETTINGS)
    assert selector_matches(selector, labels(OWNER, serve("replica-1")))
    assert selector_matches(selector, labels(OWNER, serve("replica-2")))
    assert not selector_matches(selector, labels(OWNER, serve("replica-3", endpoint="13")))
    assert not selector_matches(selector, labels(OWNER, serve("replica-4", endpoint="120")))
    assert not selector_matches(selector, labels(other_workspace, serve("replica-5")))
    notebook = ko.notebook_stateful_set(ko.Owner("vision", "dev"), "12", "img", ko.Size(1, 1), SETTINGS)
    assert not selector_matches(selector, notebook["spec"]["template"]["metadata"]["labels"])
    # Each replica gets a DNS name under it while it is ready.
    pod = ki.replica_pod(OWNER, serve("replica-1"), SETTINGS)
    assert (pod["spec"]["hostname"], pod["spec"]["subdomain"]) == ("inf-replica-1", "ep-12")


def test_only_the_portals_proxy_reaches_the_servers_port() -> None:
    policies = [o for o in ki.serve_namespace_objects("vision", SETTINGS) if o["kind"] == "NetworkPolicy"]
    replica = Pod(NS, ki.replica_pod(OWNER, serve(), SETTINGS)["metadata"]["labels"], named_ports={"http": 8000})
    proxy = Pod(SETTINGS.ingress_namespace, {"app": "gpuportal-proxy"})
    assert ingress_allowed(policies, proxy, replica, ki.SERVER_PORT)
    assert not ingress_allowed(policies, proxy, replica, 22)
    other_replica = Pod(NS, ki.replica_pod(OWNER, serve("replica-2", endpoint="13"), SETTINGS)["metadata"]["labels"])
    for source in (
        other_replica,  # replicas never call each other
        Pod(NS, {"app": "mine"}),
        Pod(ki.serve_namespace_name("other", SETTINGS), replica.labels),
        Pod(ko.jobs_namespace_name("vision", SETTINGS)),
        Pod("default"),
        Pod("mine", namespace_labels={"name": SETTINGS.ingress_namespace}),
    ):
        assert not ingress_allowed(policies, source, replica, ki.SERVER_PORT), source
    assert not ingress_allowed(policies, proxy, Pod(NS, {"app": "mine"}), ki.SERVER_PORT)


# -- the readiness probe, run for real ---------------------------------------------------------------------


class _KeyedServer(http.server.BaseHTTPRequestHandler):
    """Answers 200 on its health path to a request with the key, 401 otherwise, as the servers do."""

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        good = self.path == "/health" and self.headers.get("Authorization") == f"Bearer {KEY}"
        self.send_response(200 if good else 401)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def keyed_server() -> Iterator[int]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _KeyedServer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def _probe(port: int, key: str | None, path: str = "/health", **env: str) -> int:
    """Run the pod's probe command as the kubelet does, against ``port`` instead of the server's."""
    command = ki.replica_pod(OWNER, serve(), SETTINGS)["spec"]["containers"][0]["readinessProbe"]["exec"]["command"]
    script = command[3].replace(f":{ki.SERVER_PORT}'", f":{port}'")
    assert script != command[3]
    environment = {"PATH": os.environ["PATH"], **env, **({command[5]: key} if key is not None else {})}
    argv = [sys.executable, *command[1:3], script, path, command[5]]
    return subprocess.run(argv, env=environment, capture_output=True, timeout=30).returncode


def test_the_probe_passes_only_once_the_server_answers_its_health_path_with_the_key(keyed_server: int) -> None:
    assert _probe(keyed_server, KEY) == 0
    assert _probe(keyed_server, KEY, http_proxy="http://127.0.0.1:9", HTTP_PROXY="http://127.0.0.1:9") == 0
    assert _probe(keyed_server, "wrong") != 0
    assert _probe(keyed_server, None) != 0
    assert _probe(keyed_server, KEY, path="/v1/models") != 0
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), _KeyedServer) as closed:
        port = closed.server_address[1]
    assert _probe(port, KEY) != 0  # nothing listening


# -- the backend, against the API emulator ----------------------------------------------------------------


@pytest.fixture
def cluster() -> Iterator[Emulator]:
    with running_emulator() as emulator:
        yield emulator


def backend(cluster: Emulator, settings: ko.KubeSettings = SETTINGS, **options: Any) -> KubernetesBackend:
    options = {"start_timeout_s": 5.0, "stop_timeout_s": 5.0, "poll_interval_s": 0.01, **options}
    return KubernetesBackend(settings=settings, host=cluster.url, **options)


def spec(key: str = "replica-1", endpoint: str = "12", **overrides: Any) -> InferenceSpec:
    fields: dict[str, Any] = {
        "key": key,
        "workspace": "vision",
        "name": "qwen-1",
        "work_dir": "/srv/portal/work/vision",
        "server": "vllm",
        "model_path": "/srv/portal/work/vision/models/qwen-0.5b",
        "served_name": "qwen",
        "endpoint": endpoint,
        "image": "vllm/vllm-openai:v0.33.0",
        "gpu_type": "h100",
        "gpus": 1.0,
        "cpu_cores": 8,
        "memory_gb": 32,
        "start_timeout_s": 5.0,
        "api_key": KEY,
    }
    return InferenceSpec(**(fields | overrides))


def pod_path(key: str = "replica-1") -> str:
    return f"/api/v1/namespaces/{NS}/pods/{ki.replica_name(_workload_name(key))}"


def secret_path(key: str = "replica-1") -> str:
    return f"/api/v1/namespaces/{NS}/secrets/{ki.key_secret_name(_workload_name(key))}"


SERVICE_PATH = f"/api/v1/namespaces/{NS}/services/ep-12"
READY = {"phase": "Running", "podIP": "10.4.0.7", "conditions": [{"type": "Ready", "status": "True"}]}


def kubelet(cluster: Emulator, key: str = "replica-1", status: dict[str, Any] | None = None) -> threading.Thread:
    """The kubelet's part: once the pod exists, write its status (by default: running, its probe passing)."""
    path = pod_path(key)
    return cluster.when(path, lambda pod: True, lambda: cluster.set_status(path, status or READY))


def exited(code: int) -> dict[str, Any]:
    state = {"terminated": {"exitCode": code, "reason": "Error"}}
    return {"phase": "Failed", "containerStatuses": [{"name": "server", "state": state}]}


def test_a_replica_starts_once_its_pod_is_ready_and_its_objects_go_when_it_stops(cluster: Emulator) -> None:
    k8s = backend(cluster)
    ready = kubelet(cluster)
    endpoint = k8s.start(spec())
    ready.join()
    assert (endpoint.host, endpoint.port, endpoint.url) == ("10.4.0.7", 8000, "http://10.4.0.7:8000")
    pod = cluster.get(pod_path())
    assert pod is not None and pod["metadata"]["labels"][ki.LABEL_ENDPOINT] == "12"
    assert restricted_violations(pod["spec"]) == [] and pod["spec"]["automountServiceAccountToken"] is False
    assert KEY not in json.dumps(pod)
    secret = cluster.get(secret_path())
    assert secret is not None and secret["stringData"] == {ki.API_KEY_KEY: KEY}
    service = cluster.get(SERVICE_PATH)
    assert service is not None and service["spec"]["selector"][ki.LABEL_ENDPOINT] == "12"
    claim = cluster.get(f"/api/v1/namespaces/{NS}/persistentvolumeclaims/{ki.WORKSPACE_CLAIM}")
    assert claim is not None and claim["spec"]["volumeName"] == "gp-files-vision"
    namespace = cluster.get(f"/api/v1/namespaces/{NS}")
    assert (
        namespace is not None and namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    )
    assert k8s.poll() == Status("running", message="ready")

    # Starting again, here or from the state on another worker, converges on the same replica.
    assert k8s.start(spec()) == endpoint
    again = backend(cluster)
    again.load_state(json.loads(json.dumps(k8s.get_state())))
    assert again.poll() == Status("running", message="ready")

    cluster.respond(f"get {pod_path()}/log", b"INFO: Application startup complete.\n")
    assert again.logs(0) == (b"INFO: Application startup complete.\n", 36)
    with pytest.raises(BackendError):
        again.logs(1)

    again.stop()
    assert cluster.get(pod_path()) is None and cluster.get(secret_path()) is None
    assert cluster.get(SERVICE_PATH) is None  # the endpoint's last replica
    assert cluster.get(f"/api/v1/namespaces/{NS}") is not None  # the workspace's namespace stays, with its claim
    assert cluster.get(f"/api/v1/namespaces/{NS}/persistentvolumeclaims/{ki.WORKSPACE_CLAIM}") is not None
    assert again.poll() == Status("exited", 0, "stopped on request")
    again.stop()  # harmless


def test_the_service_stays_while_another_replica_of_the_endpoint_is_left(cluster: Emulator) -> None:
    first, second, other_endpoint = backend(cluster), backend(cluster), backend(cluster)
    for k8s, key, endpoint in ((first, "replica-1", "12"), (second, "replica-2", "12"), (other_endpoint, "r-3", "13")):
        ready = kubelet(cluster, key)
        k8s.start(spec(key, endpoint))
        ready.join()
    first.stop()
    assert cluster.get(SERVICE_PATH) is not None
    assert cluster.get(pod_path("replica-2")) is not None
    second.stop()
    assert cluster.get(SERVICE_PATH) is None
    assert cluster.get(f"/api/v1/namespaces/{NS}/services/ep-13") is not None  # another endpoint's
    assert cluster.get(pod_path("r-3")) is not None


def test_a_server_that_exits_before_it_answers_fails_for_good_with_its_last_lines(cluster: Emulator) -> None:
    k8s = backend(cluster)
    cluster.respond(f"get {pod_path()}/log", b"loading\nValueError: no config.json in /model/qwen-0.5b\n")
    dead = kubelet(cluster, status=exited(1))
    with pytest.raises(BackendError) as failed:
        k8s.start(spec())
    dead.join()
    assert failed.value.permanent
    assert "exited with code 1" in failed.value.message and "no config.json" in failed.value.message
    assert cluster.get(pod_path()) is None and cluster.get(secret_path()) is None and cluster.get(SERVICE_PATH) is None
    assert k8s.poll().state == "exited"


def test_a_server_not_ready_in_time_is_deleted_and_may_be_tried_again(cluster: Emulator) -> None:
    k8s = backend(cluster)
    waiting = {"waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling image"}}
    pulling = kubelet(cluster, status={"phase": "Pending", "containerStatuses": [{"name": "server", "state": waiting}]})
    with pytest.raises(BackendError) as late:
        k8s.start(spec(start_timeout_s=0.3))
    pulling.join()
    assert not late.value.permanent and "ImagePullBackOff" in late.value.message
    assert cluster.get(pod_path()) is None and cluster.get(SERVICE_PATH) is None


def test_poll_sees_the_server_exit_and_the_replicas_objects_go(cluster: Emulator) -> None:
    k8s = backend(cluster)
    ready = kubelet(cluster)
    k8s.start(spec())
    ready.join()
    cluster.set_status(pod_path(), exited(137))
    cluster.respond(f"get {pod_path()}/log", b"torch.OutOfMemoryError: CUDA out of memory\n")
    with k8s.polling([k8s.get_state()]):
        status = k8s.poll()
    assert status.state == "exited" and status.exit_code == 137 and "CUDA out of memory" in status.message
    assert k8s.poll() == status
    assert cluster.get(pod_path()) is None and cluster.get(secret_path()) is None and cluster.get(SERVICE_PATH) is None


def test_a_replica_whose_pod_was_deleted_outside_the_portal_has_exited(cluster: Emulator) -> None:
    k8s = backend(cluster)
    ready = kubelet(cluster)
    k8s.start(spec())
    ready.join()
    cluster.delete(pod_path())
    assert k8s.poll() == Status("exited", UNKNOWN_EXIT_CODE, "the replica's pod was deleted outside the portal")


def test_an_ended_pod_of_an_earlier_run_is_removed_before_a_new_start(cluster: Emulator) -> None:
    earlier = backend(cluster)
    ready = kubelet(cluster)
    earlier.start(spec())
    ready.join()
    cluster.set_status(pod_path(), exited(1))
    with pytest.raises(BackendError) as retry:
        backend(cluster).start(spec())
    assert not retry.value.permanent and "earlier run" in retry.value.message
    assert cluster.get(pod_path()) is None


def test_what_the_portal_must_give_and_what_the_cluster_must_have(cluster: Emulator) -> None:
    for broken in (
        spec(image=""),
        spec(api_key=""),
        spec(endpoint="Not A Label"),
        spec(model_path="/srv/portal/work/other/models/qwen"),
    ):
        with pytest.raises(BackendError) as refused:
            backend(cluster).start(broken)
        assert refused.value.permanent
    with pytest.raises(PolicyRefusal, match="workspace volume"):
        backend(cluster, settings=ko.KubeSettings()).start(spec())
    with pytest.raises(PolicyRefusal, match="--port"):
        backend(cluster).start(spec(extra_args=["--port", "9000"]))
    assert cluster.get(pod_path()) is None


def test_the_registry_configures_the_workspace_volume() -> None:
    k8s = backend_for(SimpleNamespace(kind="kubernetes", connection={"workspace_volume": "nfs-{workspace}"}))
    assert isinstance(k8s, KubernetesBackend) and k8s.settings.workspace_volume == "nfs-{workspace}"
    with pytest.raises(BackendError):
        KubernetesBackend.from_connection({"workspace_volume": "shared"})
