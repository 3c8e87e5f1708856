"""Kubernetes manifests for inference endpoints on the Kubernetes backend, as pure functions (see kubernetes_objects).

An endpoint's replica is one OpenAI-compatible server (``workers/backends/servers.py``). The portal's scheduler
admits each replica on its own, and its proxy balances requests between the replicas itself, so:

- **Each replica is a bare Pod** ``inf-<replica>`` (``restartPolicy: Never``), not a Deployment: the portal owns
  a replica's whole life (admission, restarts, rollouts, scaling), and a controller would recreate a pod the portal
  ended, on GPUs it never admitted, and share one replica count between replicas admitted one by one. A server
  that exits ends its replica, as a process does on the local backend; the portal starts another.
- **The proxy's target is the pod's own address** (``http://<pod IP>:8000``), one per replica as on the local
  and Slurm backends (a socket, a host and port each): the proxy picks the least busy replica, and each replica
  has its own API key. A Service's virtual IP would balance a second time behind the proxy's back, between
  servers whose keys differ.
- **One headless Service per endpoint**, ``ep-<endpoint id>``, selects the endpoint's pods by label (the
  replicas' ``hostname``/``subdomain`` give each ready one the DNS name ``<pod>.ep-<id>.<namespace>.svc``, and its
  EndpointSlices list the ready ones). The backend creates it with the first replica and deletes it with the last.

Where. A workspace's endpoints share the namespace ``<prefix>-<workspace>-serve-<hash>`` ("restricted" Pod
Security), created on first use and left in place, holding:

- ``gpuportal-isolate``: every pod isolated for ingress, nothing admitted (replicas never call each other);
- ``gpuportal-inference-from-proxy``: the servers' port (TCP 8000) of the inference pods is reachable from the
  ingress controller's namespace (``ingress_namespace``), where the portal's proxy runs in the cluster, as for a
  Ray cluster's dashboard;
- the PersistentVolumeClaim ``gpuportal-workspace``, bound to the cluster's PersistentVolume that holds the
  workspace's directory (``KubeSettings.workspace_volume``, ``{workspace}`` filled in: the admin's read-only
  export of the directory the portal knows as the workspace's ``work_dir``), ``storageClassName: ""`` so that
  nothing is provisioned in its place. A replica mounts only its model from it: the model's path in the
  workspace's directory as ``subPath``, read-only, at ``/model/<its name>``.

The API key. It is kept in the replica's Secret ``inf-<replica>-key`` (key ``api-key``), which the container reads
into the variable its server takes the key from (``VLLM_API_KEY``, ``API_KEY``); it is never a plain value in a
manifest. An ``httpGet`` probe's headers are plain values, so the readiness probe is an ``exec`` of the image's
``python3`` that GETs the server's health path on 127.0.0.1 with ``Authorization: Bearer $KEY`` (the server
refuses a request without the key): the pod is ready once its server answers as the proxy will call it.

The server's command is ``servers.command``'s, listening on TCP (``host`` 0.0.0.0, the pod's own addresses, and
port 8000: the proxy comes from another machine, and the key is required), with its checks of the extra arguments
(none may change where it listens or what it serves) and its environment; the key's variable is taken out of that
environment and read from the Secret instead. The pod's ``HOME`` and working directory are an ``emptyDir`` at
``/tmp``, as the pod runs as a non-root user in an image whose home may not be writable.

Pods pass "restricted" (``kubernetes_objects.restricted_pod_spec``), ask for and are held to their CPU and memory,
GPUs as limits, and mount no service-account token.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from workers.backends import kubernetes_objects as ko
from workers.backends import servers
from workers.backends.base import UNKNOWN_EXIT_CODE

Manifest = ko.Manifest

SERVER_PORT = 8000
SERVER_CONTAINER = "server"
LABEL_ENDPOINT = "gpuportal.io/endpoint"
COMPONENT = "inference"
API_KEY_KEY = "api-key"
WORKSPACE_CLAIM = "gpuportal-workspace"
NETWORK_POLICY_ISOLATE = ko.NETWORK_POLICY_ISOLATE
NETWORK_POLICY_FROM_PROXY = "gpuportal-inference-from-proxy"
MODEL_DIR = "/model"
SCRATCH_DIR = "/tmp"
# Binding a claim to a named volume needs a request no larger than the volume: the smallest there is.
CLAIM_REQUEST = "1Mi"
# What the readiness probe runs (python3 -I -c PROBE <health path> <key variable>): exit 0 once the server answers.
PROBE = (
    "import os, sys, urllib.request as u\n"
    f"r = u.Request('http://127.0.0.1:{SERVER_PORT}' + sys.argv[1], "
    "headers={'Authorization': 'Bearer ' + os.environ[sys.argv[2]]})\n"
    "u.build_opener(u.ProxyHandler({})).open(r, timeout=4).close()\n"
)
# What servers.command is given in place of the key, which the container reads from the Secret instead.
_KEY_PLACEHOLDER = "<api-key from the replica's Secret>"


@dataclass(frozen=True)
class ServeSpec:
    """One replica as the portal admitted it.

    ``name`` is the replica's DNS label (unique in the portal), ``endpoint`` its endpoint's id (a DNS label: the
    Service and the label that select the endpoint's pods); ``server`` a kind of ``servers.SERVERS``; ``model``
    the model's path relative to the workspace's directory; ``api_key`` the replica's own key.
    """

    name: str
    endpoint: str
    server: str
    image: str
    model: str
    served_name: str
    size: ko.Size
    api_key: str
    extra_args: Sequence[str] = field(default_factory=tuple)


# -- names ------------------------------------------------------------------------------------------------


def serve_namespace_name(workspace: str, settings: ko.KubeSettings) -> str:
    """The namespace of a workspace's endpoints: "<prefix>-<workspace>-serve-<hash>" (the hash covers an extra empty
    part, which no instance name can be, so that an instance named "serve" never gets this namespace)."""
    return ko.dns_name(settings.namespace_prefix, workspace, "serve", "", always_hash=True)


def serve_owner(workspace: str, settings: ko.KubeSettings) -> ko.Owner:
    return ko.Owner(workspace=workspace, instance="", namespace=serve_namespace_name(workspace, settings))


def replica_name(name: str) -> str:
    """The replica's Pod (and hostname): "inf-<name>"."""
    return ko.dns_name("inf", name)


def key_secret_name(name: str) -> str:
    return ko.dns_name("inf", name, "key")


def service_name(endpoint: str) -> str:
    """The endpoint's Service: "ep-<id>" (a DNS-1035 label: a letter first)."""
    return ko.dns_name("ep", endpoint)


def endpoint_selector(owner: ko.Owner, endpoint: str) -> dict[str, str]:
    """The labels of the endpoint's replica pods, and of nothing else: its Service selects by them."""
    return {
        "app.kubernetes.io/managed-by": ko.MANAGED_BY,
        ko.LABEL_WORKSPACE: owner.workspace,
        ko.LABEL_COMPONENT: COMPONENT,
        LABEL_ENDPOINT: endpoint,
    }


def replica_labels(owner: ko.Owner, spec: ServeSpec) -> dict[str, str]:
    return ko.portal_labels(owner, COMPONENT, spec.name) | {LABEL_ENDPOINT: spec.endpoint}


def model_mount_path(model: str) -> str:
    """Where the replica sees its model: "/model/<the model's file or directory name>"."""
    return f"{MODEL_DIR}/{os.path.basename(os.path.normpath(model))}"


def check_model_path(model: str) -> None:
    """``ValueError`` unless ``model`` is a path inside the workspace's directory (relative, no "..")."""
    normal = os.path.normpath(model) if model else ""
    if not normal or normal == "." or os.path.isabs(model) or normal == ".." or normal.startswith("../"):
        raise ValueError(f"the model's path {model!r} is not inside the workspace's directory")


# -- the namespace ----------------------------------------------------------------------------------------


def workspace_volume_name(workspace: str, settings: ko.KubeSettings) -> str:
    """The cluster's PersistentVolume holding the workspace's directory; ``ko.UnsupportedRequest`` where the
    settings name none (the cluster cannot serve models from workspaces)."""
    if not settings.workspace_volume:
        raise ko.UnsupportedRequest(
            "this Kubernetes cluster has no workspace volume configured (workspace_volume): it cannot serve models"
        )
    return settings.workspace_volume.replace("{workspace}", workspace)


def workspace_claim(workspace: str, settings: ko.KubeSettings) -> Manifest:
    """The claim on the workspace's volume, read-only, bound to it by name (never provisioned)."""
    owner = serve_owner(workspace, settings)
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": ko.object_meta(
            WORKSPACE_CLAIM, ko.portal_labels(owner, "namespace", owner.instance), ko.namespace_name(owner, settings)
        ),
        "spec": {
            "accessModes": ["ReadOnlyMany"],
            "storageClassName": "",
            "volumeName": workspace_volume_name(workspace, settings),
            "resources": {"requests": {"storage": CLAIM_REQUEST}},
        },
    }


def deny_all_network_policy(owner: ko.Owner, settings: ko.KubeSettings) -> Manifest:
    """Every pod of the namespace isolated for ingress, and no rule letting anything in."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": ko.object_meta(
            NETWORK_POLICY_ISOLATE,
            ko.portal_labels(owner, "namespace", owner.instance),
            ko.namespace_name(owner, settings),
        ),
        "spec": {"podSelector": {}, "policyTypes": ["Ingress"]},
    }


def proxy_network_policy(owner: ko.Owner, settings: ko.KubeSettings) -> Manifest:
    """The portal's proxy (in ``ingress_namespace``) reaches the inference pods' server port, and nothing else."""
    selector = {"matchLabels": {"app.kubernetes.io/managed-by": ko.MANAGED_BY, ko.LABEL_COMPONENT: COMPONENT}}
    ports = [{"protocol": "TCP", "port": SERVER_PORT}]
    return ko.ingress_controller_network_policy(owner, settings, NETWORK_POLICY_FROM_PROXY, selector, ports)


def serve_namespace_objects(workspace: str, settings: ko.KubeSettings) -> list[Manifest]:
    """A workspace's serving namespace, in the order to create it: the Namespace, its policies, the workspace's
    claim. No ResourceQuota: the portal admits each replica under the workspace's quota first."""
    owner = serve_owner(workspace, settings)
    return [
        ko.namespace(owner, settings),
        deny_all_network_policy(owner, settings),
        proxy_network_policy(owner, settings),
        workspace_claim(workspace, settings),
    ]


# -- one replica ------------------------------------------------------------------------------------------


def server_command(spec: ServeSpec) -> tuple[list[str], dict[str, str], str]:
    """The server's argv listening on the pod's port, its plain environment, and the variable it reads its key
    from (set from the Secret). ``base.PolicyRefusal`` for extra arguments the server may not be given."""
    argv, env = servers.command(
        spec.server,
        model_path=model_mount_path(spec.model),
        host="0.0.0.0",
        port=str(SERVER_PORT),
        served_name=spec.served_name,
        cpu_cores=max(1, int(spec.size.cpu_cores)),
        extra_args=list(spec.extra_args),
        api_key=_KEY_PLACEHOLDER,
    )
    (key_env,) = [name for name, value in env.items() if value == _KEY_PLACEHOLDER]
    del env[key_env]
    return argv, env, key_env


def key_secret(owner: ko.Owner, spec: ServeSpec, settings: ko.KubeSettings) -> Manifest:
    """The replica's API key, which its server and its readiness probe read from the environment."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": ko.object_meta(
            key_secret_name(spec.name), replica_labels(owner, spec), ko.namespace_name(owner, settings)
        ),
        "stringData": {API_KEY_KEY: spec.api_key},
    }


def _server_container(spec: ServeSpec, settings: ko.KubeSettings) -> Manifest:
    argv, env, key_env = server_command(spec)
    key_ref = {"secretKeyRef": {"name": key_secret_name(spec.name), "key": API_KEY_KEY}}
    health = servers.SERVERS[spec.server].health_path
    return {
        "name": SERVER_CONTAINER,
        "image": spec.image,
        "command": argv,
        "workingDir": SCRATCH_DIR,  # uvicorn puts it first on sys.path: nothing there to import instead
        "env": [
            *({"name": name, "value": value} for name, value in sorted(env.items())),
            {"name": "HOME", "value": SCRATCH_DIR},
            {"name": key_env, "valueFrom": key_ref},
        ],
        "ports": [{"name": "http", "containerPort": SERVER_PORT, "protocol": "TCP"}],
        "resources": ko.container_resources(spec.size, settings),
        "readinessProbe": {
            "exec": {"command": ["python3", "-I", "-c", PROBE, health, key_env]},
            "periodSeconds": 5,
            "timeoutSeconds": 5,
            "failureThreshold": 2,
        },
        "volumeMounts": [
            {"name": "model", "mountPath": model_mount_path(spec.model), "subPath": spec.model, "readOnly": True},
            {"name": "scratch", "mountPath": SCRATCH_DIR},
        ],
    }


def _placement(size: ko.Size, settings: ko.KubeSettings) -> dict[str, Any]:
    if size.gpus > 0 and size.gpu_type and settings.gpu_type_node_label:
        return {"nodeSelector": {settings.gpu_type_node_label: size.gpu_type}}
    return {}


def replica_pod(owner: ko.Owner, spec: ServeSpec, settings: ko.KubeSettings) -> Manifest:
    """The replica's server: one pod, never restarted by Kubernetes (the portal replaces a replica that ended),
    named in DNS through its endpoint's headless Service while it is ready."""
    check_model_path(spec.model)
    name = replica_name(spec.name)
    pod_spec = ko.restricted_pod_spec(
        [_server_container(spec, settings)],
        settings,
        restartPolicy="Never",
        hostname=name,
        subdomain=service_name(spec.endpoint),
        volumes=[
            {"name": "model", "persistentVolumeClaim": {"claimName": WORKSPACE_CLAIM, "readOnly": True}},
            {"name": "scratch", "emptyDir": {}},
        ],
        **_placement(spec.size, settings),
    )
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": ko.object_meta(name, replica_labels(owner, spec), ko.namespace_name(owner, settings)),
        "spec": pod_spec,
    }


def endpoint_service(owner: ko.Owner, endpoint: str, settings: ko.KubeSettings) -> Manifest:
    """The endpoint's headless Service: its ready replicas' pods, by the endpoint's label."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": ko.object_meta(
            service_name(endpoint),
            ko.portal_labels(owner, "endpoint", endpoint) | {LABEL_ENDPOINT: endpoint},
            ko.namespace_name(owner, settings),
        ),
        "spec": {
            "clusterIP": "None",
            "selector": endpoint_selector(owner, endpoint),
            "ports": [{"name": "http", "port": SERVER_PORT, "targetPort": "http", "protocol": "TCP"}],
        },
    }


def replica_objects(owner: ko.Owner, spec: ServeSpec, settings: ko.KubeSettings) -> list[Manifest]:
    """A replica's own objects, in the order to create them (the Secret before the pod that reads it)."""
    return [key_secret(owner, spec, settings), replica_pod(owner, spec, settings)]


# -- what the API server says -----------------------------------------------------------------------------


def pod_ready(pod: dict[str, Any]) -> bool:
    """The pod's readiness probe passed (its server answers with the key) and it has an address."""
    status = pod.get("status") or {}
    conditions = status.get("conditions") or []
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
    return ready and bool(status.get("podIP"))


def pod_exit(pod: dict[str, Any]) -> int | None:
    """The server's exit code once the pod ended (``phase`` Succeeded or Failed), else None; where the pod
    ended without one (evicted, its node lost): ``UNKNOWN_EXIT_CODE``."""
    status = pod.get("status") or {}
    if status.get("phase") not in ("Succeeded", "Failed"):
        return None
    for container in status.get("containerStatuses") or []:
        terminated = (container.get("state") or {}).get("terminated") or {}
        if container.get("name") == SERVER_CONTAINER and terminated.get("exitCode") is not None:
            return int(terminated["exitCode"])
    return UNKNOWN_EXIT_CODE


def pod_waiting(pod: dict[str, Any]) -> str:
    """Why the server's container is not running yet ("ErrImagePull: ..."), or ""."""
    for container in (pod.get("status") or {}).get("containerStatuses") or []:
        waiting = (container.get("state") or {}).get("waiting") or {}
        if container.get("name") == SERVER_CONTAINER and waiting.get("reason"):
            return f"{waiting['reason']}: {waiting.get('message') or ''}".rstrip(": ")
    return ""


def target_url(pod: dict[str, Any]) -> str:
    """Where the portal's proxy sends the replica's requests: the pod's address and the server's port."""
    ip = str((pod.get("status") or {}).get("podIP") or "")
    host = f"[{ip}]" if ":" in ip else ip
    return f"http://{host}:{SERVER_PORT}"
