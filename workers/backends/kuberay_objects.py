"""KubeRay manifests for a Ray cluster on the Kubernetes backend, as pure functions (see kubernetes_objects).

A Ray cluster is a KubeRay ``ray.io/v1`` RayCluster (a head and one worker group of fixed size), or, when it
runs an entrypoint, a RayJob wrapping that cluster's spec: KubeRay starts the cluster, submits the entrypoint as
a Ray job once the cluster is up, and deletes the cluster when the job ends (``shutdownAfterJobFinishes``).
The fields used are those KubeRay ``KUBERAY_VERSION`` documents (docs/reference/api.md and
ray-operator/apis/ray/v1/*_types.go at that tag); tests/backends/kuberay_fields.py checks every manifest against
them. Nothing here talks to a cluster.

Where. A workspace's Ray clusters share one namespace, ``<prefix>-<workspace>-ray-<hash>``, whose
NetworkPolicy ``gpuportal-isolate`` denies all ingress to every pod in it. Each cluster then gets two policies of
its own: its pods (head, workers, the RayJob's submitter, all labelled with the cluster's name) reach each other
on any port, and its head's dashboard port (8265: the dashboard and the Jobs API) is reachable from the ingress
controller's namespace (as notebooks are) and, for a RayJob, from the KubeRay operator (which polls the Jobs API
for the job's status). NetworkPolicies add up and none subtracts, so this could not be had in the workspace's
jobs namespace, where every pod accepts every other.

Pods. Head, workers and submitter are built by ``restricted_pod_spec`` ("restricted" Pod Security, no service
account token, requests equal to limits); KubeRay copies the Ray container's security context to the init
container it adds, and enables no autoscaler here (``enableInTreeAutoscaling: false``), so no pod of the
cluster needs more than "restricted". The submitter's template is the portal's own: KubeRay's default one has
no security context, which a "restricted" namespace would refuse.

Token authentication (Ray 2.52+). The cluster's ``auth_token`` is kept in the Secret ``ray-<name>-auth`` under
``auth_token``, the key KubeRay's ``authOptions.secretName`` documents. Every Ray container reads it as
``RAY_AUTH_TOKEN`` with ``RAY_AUTH_MODE=token`` (the variables Ray reads), set in the templates so that the
pods are right whatever the operator adds; ``authOptions`` (mode ``token``, that Secret) has KubeRay set the
same variables in the containers it adds itself (the submitter's, with the token, for ``ray job submit``) and
keeps it from generating a token of its own. The token is never a plain value in a manifest.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from workers.backends import kubernetes_objects as ko
from workers.backends.base import STOPPED_EXIT_CODE, TIMEOUT_EXIT_CODE, UNKNOWN_EXIT_CODE

Manifest = ko.Manifest

#: The KubeRay release whose documented fields these manifests use.
KUBERAY_VERSION = "v1.7.0"
RAY_API_GROUP = "ray.io"
RAY_API_VERSION = "v1"
RAY_CLUSTER_PLURAL = "rayclusters"
RAY_JOB_PLURAL = "rayjobs"
#: The Ray release of the default image (and of ``rayVersion``, which KubeRay needs for token authentication).
RAY_VERSION = "2.60.0"
DEFAULT_RAY_IMAGE = f"rayproject/ray:{RAY_VERSION}"
#: Where KubeRay's documented ``helm install kuberay-operator kuberay/kuberay-operator`` puts the operator (the
#: release's namespace), and the label its chart gives the operator's pod.
DEFAULT_OPERATOR_NAMESPACE = "default"
OPERATOR_POD_LABELS = {"app.kubernetes.io/name": "kuberay-operator"}

DASHBOARD_PORT = 8265  # the dashboard and the Jobs API
GCS_PORT = 6379
CLIENT_PORT = 10001
WORKER_GROUP = "workers"
HEAD_CONTAINER = "ray-head"
WORKER_CONTAINER = "ray-worker"
SUBMITTER_CONTAINER = "ray-job-submitter"
# The Secret key KubeRay's authOptions.secretName documents, and the variables Ray 2.60 reads.
AUTH_TOKEN_KEY = "auth_token"
AUTH_MODE_ENV = "RAY_AUTH_MODE"
AUTH_TOKEN_ENV = "RAY_AUTH_TOKEN"
LABEL_ROLE = "gpuportal.io/role"
NETWORK_POLICY_ISOLATE = ko.NETWORK_POLICY_ISOLATE
# RayJob names are at most 47 characters (KubeRay's MaxRayJobNameLength; a RayCluster's 53), DNS-1035 labels.
MAX_NAME = 47
# What the submitter pod (`ray job submit`, then `ray job logs --follow`) gets: requests equal to limits, within
# the limits of KubeRay's default submitter (1 CPU, 1Gi).
SUBMITTER_RESOURCES = {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"cpu": "500m", "memory": "1Gi"}}

# Set by the portal (token authentication) or refused by KubeRay's validation (they turn on GCS fault tolerance).
_RESERVED_ENV = frozenset({AUTH_MODE_ENV, AUTH_TOKEN_ENV, "RAY_AUTH_TOKEN_PATH", "RAY_ENABLE_K8S_TOKEN_AUTH"})
_KUBERAY_ENV = frozenset({"RAY_REDIS_ADDRESS", "REDIS_PASSWORD", "REDIS_USERNAME"})
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
# KubeRay's JobDeploymentStatus values after which nothing changes (rayjob_types.go, IsJobDeploymentTerminal).
_DEPLOYMENT_ENDED = frozenset({"Complete", "Failed"})
# How Ray's job supervisor (dashboard/modules/job/job_supervisor.py, Ray 2.60) begins a failed job's message when
# its entrypoint exited non-zero; KubeRay copies that message into the RayJob's ``status.message``.
_ENTRYPOINT_EXIT = re.compile(r"Job entrypoint command failed with exit code (-?\d+)[,.]")


@dataclass(frozen=True)
class RaySpec:
    """A Ray cluster as the portal admitted it: a head of ``head``'s size and ``workers`` workers of ``worker``'s.

    ``name`` is the workload's DNS label (unique in the portal); ``auth_token`` the cluster's Ray token;
    ``entrypoint`` a shell command run as the cluster's Ray job (empty: the cluster runs until stopped);
    ``env`` the user's variables, ``portal_env`` the GPUPORTAL_* ones (set over ``env``, the credential read from
    the cluster's Secret); ``max_runtime_s`` the RayJob's ``activeDeadlineSeconds``; ``operator_namespace`` where
    the KubeRay operator runs (its pod may reach a RayJob's dashboard).
    """

    name: str
    image: str
    head: ko.Size
    worker: ko.Size
    workers: int
    auth_token: str
    entrypoint: str = ""
    env: Mapping[str, str] | None = None
    portal_env: Mapping[str, str] | None = None
    max_runtime_s: int | None = None
    ray_version: str = RAY_VERSION
    operator_namespace: str = DEFAULT_OPERATOR_NAMESPACE

    @property
    def kind(self) -> str:
        """The KubeRay object that runs it: a RayJob for an entrypoint, a RayCluster otherwise."""
        return "RayJob" if self.entrypoint else "RayCluster"


# -- names ------------------------------------------------------------------------------------------------


def ray_namespace_name(workspace: str, settings: ko.KubeSettings) -> str:
    """The namespace of a workspace's Ray clusters: "<prefix>-<workspace>-ray-<hash>".

    As for the jobs namespace, the hash covers an extra empty part, which no instance name can be, so an instance
    named "ray" gets a namespace of its own and never this one.
    """
    return ko.dns_name(settings.namespace_prefix, workspace, "ray", "", always_hash=True)


def ray_owner(workspace: str, settings: ko.KubeSettings) -> ko.Owner:
    return ko.Owner(workspace=workspace, instance="", namespace=ray_namespace_name(workspace, settings))


def cluster_name(name: str) -> str:
    """The RayCluster's or RayJob's name: "ray-<name>", a DNS-1035 label within KubeRay's limits."""
    return ko.dns_name("ray", name, max_length=MAX_NAME)


def head_service_name(name: str) -> str:
    """The head's Service, which KubeRay names "<RayCluster or RayJob>-head-svc" (a RayJob gets one of its own)."""
    return f"{cluster_name(name)}-head-svc"


def dashboard_url(name: str, namespace: str) -> str:
    return f"http://{head_service_name(name)}.{namespace}.svc:{DASHBOARD_PORT}"


def auth_secret_name(name: str) -> str:
    return ko.dns_name("ray", name, "auth")


def cluster_labels(owner: ko.Owner, name: str, role: str | None = None) -> dict[str, str]:
    """The portal's labels of a cluster's objects; with ``role`` (head, worker, submitter), of its pods."""
    labels = ko.portal_labels(owner, "ray", name)
    return labels | {LABEL_ROLE: role} if role else labels


def cluster_selector(name: str, role: str | None = None) -> dict[str, Any]:
    """Selects the cluster's pods (of one ``role``): the portal's, the "ray" component, the cluster's name."""
    labels = {"app.kubernetes.io/managed-by": ko.MANAGED_BY, ko.LABEL_COMPONENT: "ray", ko.LABEL_NAME: name}
    return {"matchLabels": labels | ({LABEL_ROLE: role} if role else {})}


# -- the namespace ----------------------------------------------------------------------------------------


def deny_all_network_policy(owner: ko.Owner, settings: ko.KubeSettings) -> Manifest:
    """Every pod of the namespace is isolated for ingress and no rule lets anything in: what reaches a cluster's
    pods is what that cluster's own policies name, and a pod whose policies are gone (being deleted) is closed."""
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


def ray_namespace_objects(workspace: str, settings: ko.KubeSettings) -> list[Manifest]:
    """A workspace's Ray namespace ("restricted" Pod Security) and its deny-all policy, in the order to create them.

    No ResourceQuota: the portal admits a cluster under the workspace's quota before it reaches the cluster.
    """
    owner = ray_owner(workspace, settings)
    return [ko.namespace(owner, settings), deny_all_network_policy(owner, settings)]


# -- one cluster ------------------------------------------------------------------------------------------


def auth_secret(owner: ko.Owner, spec: RaySpec, settings: ko.KubeSettings) -> Manifest:
    """The cluster's Ray token (under ``auth_token``), and its portal credential where it has one."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": ko.object_meta(
            auth_secret_name(spec.name), cluster_labels(owner, spec.name), ko.namespace_name(owner, settings)
        ),
        "stringData": {AUTH_TOKEN_KEY: spec.auth_token, **_portal_token_data(spec.portal_env)},
    }


def _portal_token_data(portal_env: Mapping[str, str] | None) -> dict[str, str]:
    token = (portal_env or {}).get(ko.PORTAL_TOKEN_ENV)
    return {ko.PORTAL_TOKEN_KEY: token} if token else {}


def auth_env(name: str) -> list[dict[str, Any]]:
    """``RAY_AUTH_MODE=token`` and ``RAY_AUTH_TOKEN`` from the cluster's Secret."""
    token_ref = {"secretKeyRef": {"name": auth_secret_name(name), "key": AUTH_TOKEN_KEY}}
    return [{"name": AUTH_MODE_ENV, "value": "token"}, {"name": AUTH_TOKEN_ENV, "valueFrom": token_ref}]


def node_env(spec: RaySpec) -> list[dict[str, Any]]:
    """A Ray node's variables: the user's (``UnsupportedRequest`` for a name that is invalid, set by the portal
    or refused by KubeRay), the GPUPORTAL_* ones over them, then token authentication's."""
    env = dict(spec.env or {})
    bad = sorted(key for key in env if not _ENV_NAME.match(key))
    if bad:
        raise ko.UnsupportedRequest(f"not valid environment variable names: {', '.join(bad)}")
    reserved = sorted(key for key in env if key in _RESERVED_ENV | _KUBERAY_ENV or key.startswith("PORTAL_"))
    if reserved:
        raise ko.UnsupportedRequest(
            f"these environment variables are set by the portal or KubeRay: {', '.join(reserved)}"
        )
    portal = spec.portal_env or {}
    user = [{"name": key, "value": value} for key, value in sorted(env.items()) if key not in portal]
    return [*user, *ko.portal_env_vars(portal, auth_secret_name(spec.name)), *auth_env(spec.name)]


def _placement(size: ko.Size, settings: ko.KubeSettings) -> dict[str, Any]:
    if size.gpus > 0 and size.gpu_type and settings.gpu_type_node_label:
        return {"nodeSelector": {settings.gpu_type_node_label: size.gpu_type}}
    return {}


def _template(owner: ko.Owner, spec: RaySpec, role: str, container: Manifest, settings: ko.KubeSettings) -> Manifest:
    size = spec.head if role == "head" else spec.worker
    pod = ko.restricted_pod_spec([container], settings, **_placement(size, settings))
    return {"metadata": {"labels": cluster_labels(owner, spec.name, role)}, "spec": pod}


def head_template(owner: ko.Owner, spec: RaySpec, settings: ko.KubeSettings) -> Manifest:
    """The head's pod template: the Ray container (KubeRay writes its ``ray start`` command) with the head's
    CPU, memory and GPUs, and the ports KubeRay's head Service exposes."""
    container = {
        "name": HEAD_CONTAINER,
        "image": spec.image,
        "env": node_env(spec),
        "ports": [
            {"name": "gcs-server", "containerPort": GCS_PORT},
            {"name": "dashboard", "containerPort": DASHBOARD_PORT},
            {"name": "client", "containerPort": CLIENT_PORT},
        ],
        "resources": ko.container_resources(spec.head, settings),
    }
    return _template(owner, spec, "head", container, settings)


def worker_template(owner: ko.Owner, spec: RaySpec, settings: ko.KubeSettings) -> Manifest:
    container = {
        "name": WORKER_CONTAINER,
        "image": spec.image,
        "env": node_env(spec),
        "resources": ko.container_resources(spec.worker, settings),
    }
    return _template(owner, spec, "worker", container, settings)


def ray_cluster_spec(owner: ko.Owner, spec: RaySpec, settings: ko.KubeSettings) -> Manifest:
    """The RayClusterSpec: token authentication from the cluster's Secret, no autoscaler, a head, and one worker
    group "workers" of exactly ``spec.workers`` pods (replicas = minReplicas = maxReplicas: a gang)."""
    if spec.workers < 0:
        raise ValueError(f"a Ray cluster cannot have {spec.workers} workers")
    return {
        "rayVersion": spec.ray_version,
        "enableInTreeAutoscaling": False,
        "authOptions": {"mode": "token", "secretName": auth_secret_name(spec.name)},
        "headGroupSpec": {
            "rayStartParams": {"dashboard-host": "0.0.0.0"},
            "template": head_template(owner, spec, settings),
        },
        "workerGroupSpecs": [
            {
                "groupName": WORKER_GROUP,
                "replicas": spec.workers,
                "minReplicas": spec.workers,
                "maxReplicas": spec.workers,
                "rayStartParams": {},
                "template": worker_template(owner, spec, settings),
            }
        ],
    }


def ray_cluster(owner: ko.Owner, spec: RaySpec, settings: ko.KubeSettings) -> Manifest:
    """A RayCluster that runs until it is deleted."""
    return {
        "apiVersion": f"{RAY_API_GROUP}/{RAY_API_VERSION}",
        "kind": "RayCluster",
        "metadata": ko.object_meta(
            cluster_name(spec.name), cluster_labels(owner, spec.name), ko.namespace_name(owner, settings)
        ),
        "spec": ray_cluster_spec(owner, spec, settings),
    }


def submitter_template(owner: ko.Owner, spec: RaySpec, settings: ko.KubeSettings) -> Manifest:
    """The pod of the Job KubeRay creates to run ``ray job submit``: "restricted", labelled as the cluster's (so
    that its policy lets it reach the head), with the token; KubeRay writes its command."""
    container = {
        "name": SUBMITTER_CONTAINER,
        "image": spec.image,
        "env": auth_env(spec.name),
        "resources": {part: dict(values) for part, values in SUBMITTER_RESOURCES.items()},
    }
    pod = ko.restricted_pod_spec([container], settings, restartPolicy="Never")
    return {"metadata": {"labels": cluster_labels(owner, spec.name, "submitter")}, "spec": pod}


def job_entrypoint(command: str) -> str:
    """The RayJob's ``entrypoint`` for a shell command.

    KubeRay pastes ``entrypoint`` into the submitter's shell script after ``ray job submit ... --``, and the Ray
    CLI joins the words it gets back with ``shlex.join``; so the command goes as ``/bin/sh -c '<command>'``: the
    submitter's shell reads it as three words, and the Ray job runs the whole command, operators and all, on
    the cluster (never in the submitter).
    """
    return shlex.join(["/bin/sh", "-c", command])


def ray_job(owner: ko.Owner, spec: RaySpec, settings: ko.KubeSettings) -> Manifest:
    """A RayJob: the cluster of ``ray_cluster_spec``, its entrypoint submitted once the cluster is up, the cluster
    deleted as soon as the job ends (the submitter's Job, with the job's output, stays with the RayJob).
    No retries (``backoffLimit: 0``): the portal owns retries; ``max_runtime_s`` is ``activeDeadlineSeconds``."""
    job_spec: dict[str, Any] = {
        "entrypoint": job_entrypoint(spec.entrypoint),
        "submissionMode": "K8sJobMode",
        "shutdownAfterJobFinishes": True,
        "backoffLimit": 0,
        "rayClusterSpec": ray_cluster_spec(owner, spec, settings),
        "submitterPodTemplate": submitter_template(owner, spec, settings),
    }
    if spec.max_runtime_s:
        job_spec["activeDeadlineSeconds"] = spec.max_runtime_s
    return {
        "apiVersion": f"{RAY_API_GROUP}/{RAY_API_VERSION}",
        "kind": "RayJob",
        "metadata": ko.object_meta(
            cluster_name(spec.name), cluster_labels(owner, spec.name), ko.namespace_name(owner, settings)
        ),
        "spec": job_spec,
    }


def cluster_network_policy(owner: ko.Owner, spec: RaySpec, settings: ko.KubeSettings) -> Manifest:
    """The cluster's pods (head, workers, submitter) accept its own pods, on any port, and nothing else."""
    selector = cluster_selector(spec.name)
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": ko.object_meta(
            cluster_name(spec.name), cluster_labels(owner, spec.name), ko.namespace_name(owner, settings)
        ),
        "spec": {
            "podSelector": selector,
            "policyTypes": ["Ingress"],
            "ingress": [{"from": [{"podSelector": selector}]}],
        },
    }


def dashboard_network_policy(owner: ko.Owner, spec: RaySpec, settings: ko.KubeSettings) -> Manifest:
    """The head's dashboard port (the dashboard and the Jobs API) accepts the ingress controller's namespace (the
    portal's proxy goes through it, as for notebooks) and, for a RayJob, the KubeRay operator's pod, which reads
    the job's status from there. Namespaces are matched by the name label only the API server sets."""
    port = [{"protocol": "TCP", "port": DASHBOARD_PORT}]
    ingress = {"namespaceSelector": {"matchLabels": {ko.NAMESPACE_NAME_LABEL: settings.ingress_namespace}}}
    rules: list[dict[str, Any]] = [{"from": [ingress], "ports": port}]
    if spec.kind == "RayJob":
        operator = {
            "namespaceSelector": {"matchLabels": {ko.NAMESPACE_NAME_LABEL: spec.operator_namespace}},
            "podSelector": {"matchLabels": dict(OPERATOR_POD_LABELS)},
        }
        rules.append({"from": [operator], "ports": port})
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": ko.object_meta(
            ko.dns_name("ray", spec.name, "dashboard"),
            cluster_labels(owner, spec.name),
            ko.namespace_name(owner, settings),
        ),
        "spec": {"podSelector": cluster_selector(spec.name, "head"), "policyTypes": ["Ingress"], "ingress": rules},
    }


def ray_objects(owner: ko.Owner, spec: RaySpec, settings: ko.KubeSettings) -> list[Manifest]:
    """A Ray cluster, in the order to create it: the Secret and the policies before the pods that need them, then
    the RayJob (for an entrypoint) or the RayCluster."""
    workload = ray_job(owner, spec, settings) if spec.entrypoint else ray_cluster(owner, spec, settings)
    return [
        auth_secret(owner, spec, settings),
        cluster_network_policy(owner, spec, settings),
        dashboard_network_policy(owner, spec, settings),
        workload,
    ]


# -- what KubeRay reports ---------------------------------------------------------------------------------


def cluster_ready(status: Mapping[str, Any] | None, workers: int) -> bool:
    """A RayClusterStatus says the cluster is up: ``state`` "ready" (every pod running) with every worker ready."""
    status = status or {}
    return status.get("state") == "ready" and int(status.get("readyWorkerReplicas") or 0) >= workers


def job_ended(ray_job_obj: Mapping[str, Any]) -> bool:
    return (ray_job_obj.get("status") or {}).get("jobDeploymentStatus") in _DEPLOYMENT_ENDED


def job_started(ray_job_obj: Mapping[str, Any], workers: int) -> bool:
    """A RayJob's cluster is up (or the job is already running, or over)."""
    status = ray_job_obj.get("status") or {}
    if status.get("jobDeploymentStatus") in _DEPLOYMENT_ENDED | {"Running"}:
        return True
    return cluster_ready(status.get("rayClusterStatus"), workers)


def job_outcome(ray_job_obj: Mapping[str, Any]) -> tuple[int, str] | None:
    """(exit code, message) once a RayJob ended, ``None`` while it runs.

    The Ray job's own ``jobStatus``: SUCCEEDED → 0, STOPPED → ``STOPPED_EXIT_CODE``, FAILED → the entrypoint's exit
    code, which KubeRay has no field for but copies in Ray's message (``entrypoint_exit_code``), else 1 (the
    entrypoint did not run: Ray could not start it, or lost the job); the RayJob failing past
    ``activeDeadlineSeconds`` → ``TIMEOUT_EXIT_CODE``; failing otherwise (the submission, a deadline before it ran)
    → ``UNKNOWN_EXIT_CODE``.
    """
    status = ray_job_obj.get("status") or {}
    if status.get("jobDeploymentStatus") not in _DEPLOYMENT_ENDED:
        return None
    job_status, reason = status.get("jobStatus") or "", status.get("reason") or ""
    detail = status.get("message") or reason or job_status or "failed"
    if reason == "DeadlineExceeded":
        return TIMEOUT_EXIT_CODE, "killed by KubeRay after exceeding its time limit"
    if job_status == "SUCCEEDED":
        return 0, "exited"
    if job_status == "STOPPED":
        return STOPPED_EXIT_CODE, "the Ray job was stopped"
    if job_status == "FAILED":
        code = entrypoint_exit_code(str(status.get("message") or ""))
        if code:
            return code, f"the Ray job's entrypoint exited with code {code}"
        return 1, f"the Ray job failed: {detail}"
    return UNKNOWN_EXIT_CODE, f"the RayJob failed: {detail}"


def entrypoint_exit_code(message: str) -> int | None:
    """The entrypoint's exit code in a failed Ray job's message, as Ray's job supervisor writes it ("Job entrypoint
    command failed with exit code 3, last available logs ..."), a signal's ``-N`` as a shell says it, 128 + N;
    ``None`` where the message gives none."""
    found = _ENTRYPOINT_EXIT.match(message)
    if found is None:
        return None
    code = int(found.group(1))
    return 128 - code if code < 0 else code


def job_ended_at(ray_job_obj: Mapping[str, Any]) -> float | None:
    """When a RayJob ended (KubeRay's ``status.endTime``, set as it turns Complete or Failed), in seconds since the
    epoch; ``None`` while it runs, or where KubeRay did not say."""
    if not job_ended(ray_job_obj):
        return None
    try:
        return datetime.fromisoformat(str((ray_job_obj.get("status") or {}).get("endTime") or "")).timestamp()
    except ValueError:
        return None
