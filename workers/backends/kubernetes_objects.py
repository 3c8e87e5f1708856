"""Kubernetes manifests for the Kubernetes backend, as pure functions (after KubeSpawner's objects.py).

Every function takes plain values and returns plain dicts (the JSON the API server accepts); nothing here
talks to a cluster, reads settings or imports Django, so every manifest can be checked against the
Kubernetes schemas in a unit test. The backend owns the calls (create, 409 means done; delete, 404 means done).

Names. Workspace, instance, notebook and job names are DNS-1123 labels already. Names built from several of
them go through `dns_name`, which keeps them within 63 characters with a deterministic hash suffix. A
namespace name always carries that hash: "team-a" + "dev" and "team" + "a-dev" would otherwise both give
"gp-team-a-dev", and an idempotent create would then hand one tenant the other's namespace.

Quantities. CPU is whole cores ("4"), memory is the profile's GB read as GiB ("16Gi"). Every container of
every pod asks for (requests) and is held to (limits) its CPU and memory: `restricted_pod_spec` refuses one
that does not, so no pod of the portal's can take a node's whole CPU or memory. Whole GPUs are asked
for as `KubeSettings.gpu_resource_name` (the NVIDIA device plugin's "nvidia.com/gpu"), or as the resource
`gpu_type_resources` names for the GPU type: a MIG profile is its own GPU type with whole counts
(docs/fractional-gpus.md), e.g. {"a100-1g-10gb": "nvidia.com/mig-1g.10gb"}. A fraction of a GPU can only be
had where the cluster shares GPUs by time-slicing with `renameByDefault` ("nvidia.com/gpu.shared", each GPU
advertised `fractional_gpus_per_gpu` times): set `fractional_gpu_resource_name` to that resource; without
it a fractional request is refused with `UnsupportedRequest`. Time-slicing does not isolate memory.

Isolation (docs/kubernetes.md, "What is isolated"). Every namespace is labelled to enforce the "restricted"
Pod Security Standard, and every pod spec is built by `restricted_pod_spec`, which makes it pass that profile
(non-root user and group from the settings, RuntimeDefault seccomp, no privilege escalation, every capability
dropped, no host namespaces or host paths) and mounts no service-account token unless the workload names a
service account. Every namespace gets `network_policy` (ingress only from its own pods); notebooks are also
reachable from the ingress controller's namespace (`notebook_ingress_network_policy`).

An instance of kind "vcluster" is built in `kubernetes_vcluster` from these pieces.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Literal

Manifest = dict[str, Any]

MANAGED_BY = "gpuportal"
LABEL_WORKSPACE = "gpuportal.io/workspace"
LABEL_INSTANCE = "gpuportal.io/instance"
LABEL_COMPONENT = "gpuportal.io/component"
LABEL_NAME = "gpuportal.io/name"
JOB_INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
JUPYTER_PORT = 8888
TOKEN_KEY = "token"
# A workload's portal credential (GPUPORTAL_TOKEN of its portal_env) is kept in a Secret under this key, and
# its other GPUPORTAL_* variables are plain values.
PORTAL_TOKEN_KEY = "portal-token"
PORTAL_TOKEN_ENV = "GPUPORTAL_TOKEN"
GANG_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "JOB_COMPLETION_INDEX")

# Pod Security Admission: the level every namespace enforces, audits and warns about.
POD_SECURITY_LEVEL = "restricted"
POD_SECURITY_MODES = ("enforce", "audit", "warn")
NETWORK_POLICY_ISOLATE = "gpuportal-isolate"
NETWORK_POLICY_NOTEBOOK_INGRESS = "gpuportal-notebooks-from-ingress"
# Set by the API server on every namespace and immutable: a tenant cannot give its namespace another's name.
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_POD_SECURITY_VERSION = re.compile(r"^(latest|v1\.(0|[1-9][0-9]*))$")
_MAX_ID = 2**31 - 1


class UnsupportedRequest(ValueError):
    """The request cannot be expressed on this cluster: a policy refusal (the backend raises it as
    `base.PolicyRefusal`), not a backend error."""


class InvalidSettings(ValueError):
    """A `KubeSettings` value that cannot be used; the message names every bad field."""


@dataclass(frozen=True)
class KubeSettings:
    """What differs from one cluster to the next; defaults suit ingress-nginx and NVIDIA's device plugin."""

    ingress_namespace: str = "ingress-nginx"
    ingress_class_name: str = "nginx"
    ingress_mode: Literal["path", "host"] = "path"
    # Path mode: the one host notebooks are served under (None: any host). Host mode: the parent domain.
    ingress_host: str | None = None
    ingress_tls_secret: str | None = None
    gpu_resource_name: str = "nvidia.com/gpu"
    gpu_type_resources: Mapping[str, str] = field(default_factory=dict)
    fractional_gpu_resource_name: str | None = None
    fractional_gpus_per_gpu: int = 4
    # A node label whose value is the portal's GPU type (e.g. "h100"); None: do not pin GPU types to nodes.
    gpu_type_node_label: str | None = None
    namespace_prefix: str = "gp"
    max_pods_per_namespace: int = 100
    # Prepended to portal usernames in RoleBindings, as the API server's OIDC authenticator names users.
    username_prefix: str = ""
    master_port: int = 29500
    job_ttl_after_finished_s: int = 3600
    # The image of the Job that installs a vcluster's chart: it runs `helm`.
    helm_image: str = "alpine/helm:3.17.3"
    # Every pod the portal creates runs as this user and group (never root), its volumes owned by `pod_fs_group`.
    # The defaults are the Jupyter Docker Stacks' jovyan (1000) and users (100).
    pod_run_as_user: int = 1000
    pod_run_as_group: int = 100
    pod_fs_group: int = 100
    # The Pod Security Standards version the namespaces' labels pin: "latest", or a release such as "v1.37".
    pod_security_version: str = "latest"
    # The PersistentVolume holding a workspace's directory, "{workspace}" filled in (e.g. "gp-files-{workspace}"):
    # a read-only export of what the portal knows as the workspace's work_dir, which inference replicas mount their
    # model from (kubernetes_inference). None: this cluster serves no models.
    workspace_volume: str | None = None

    def __post_init__(self) -> None:
        problems = [
            f"{name} must be a whole number from 1 to {_MAX_ID} (not root), not {value!r}"
            for name, value in [
                ("pod_run_as_user", self.pod_run_as_user),
                ("pod_run_as_group", self.pod_run_as_group),
                ("pod_fs_group", self.pod_fs_group),
            ]
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= _MAX_ID
        ]
        if not isinstance(self.pod_security_version, str) or not _POD_SECURITY_VERSION.match(self.pod_security_version):
            problems.append(f"pod_security_version must be 'latest' or 'v1.<minor>', not {self.pod_security_version!r}")
        if not isinstance(self.ingress_namespace, str) or not _DNS_LABEL.match(self.ingress_namespace):
            problems.append(f"ingress_namespace must be a namespace name, not {self.ingress_namespace!r}")
        if self.workspace_volume is not None and (
            not isinstance(self.workspace_volume, str) or "{workspace}" not in self.workspace_volume
        ):
            volume = self.workspace_volume
            problems.append(f"workspace_volume must name a volume per workspace ({{workspace}}), not {volume!r}")
        if problems:
            raise InvalidSettings("; ".join(problems))


@dataclass(frozen=True)
class Size:
    """What one pod (or one replica of a gang) gets: a profile's or a workload's size."""

    cpu_cores: float
    memory_gb: float
    gpus: Decimal = Decimal(0)
    gpu_type: str = ""


@dataclass(frozen=True)
class Owner:
    """Whose object it is: every object carries these as labels.

    `namespace`, where given, is the namespace the objects go to (a notebook's instance namespace as the
    backend recorded it, a workspace's jobs namespace); otherwise it is derived from the names.
    """

    workspace: str
    instance: str
    namespace: str | None = None


# -- names and labels -------------------------------------------------------------------------------------


def dns_name(*parts: str, max_length: int = 63, always_hash: bool = False) -> str:
    """Join DNS-1123 label parts with '-'; past `max_length` (or always, if asked) cut and add a hash.

    The hash is of the parts themselves, so different part lists get different names even when their joins
    agree, and the same parts always get the same name.
    """
    joined = "-".join(parts)
    if len(joined) <= max_length and not always_hash:
        return joined
    digest = hashlib.sha256("\x00".join(parts).encode()).hexdigest()[:10]
    head = joined[: max_length - len(digest) - 1].rstrip("-")
    return f"{head}-{digest}"


def namespace_name(owner: Owner, settings: KubeSettings) -> str:
    if owner.namespace:
        return owner.namespace
    return dns_name(settings.namespace_prefix, owner.workspace, owner.instance, always_hash=True)


def jobs_namespace_name(workspace: str, settings: KubeSettings) -> str:
    """The namespace a workspace's jobs run in: "<prefix>-<workspace>-jobs-<hash>".

    The hash covers an extra empty part, which no instance name can be, so an instance named "jobs" gets a
    namespace of its own and never this one.
    """
    return dns_name(settings.namespace_prefix, workspace, "jobs", "", always_hash=True)


def jobs_owner(workspace: str, settings: KubeSettings) -> Owner:
    return Owner(workspace=workspace, instance="", namespace=jobs_namespace_name(workspace, settings))


def notebook_name(notebook: str) -> str:
    # Services need a DNS-1035 label (a letter first); notebook names may start with a digit.
    return dns_name("nb", notebook)


def notebook_token_secret_name(notebook: str) -> str:
    return dns_name("nb", notebook, "token")


def job_portal_secret_name(job: str) -> str:
    return dns_name("job", job, "portal")


def job_name(job: str) -> str:
    # An indexed Job's pods are named and hostnamed "<job>-<index>": leave room for "-1023".
    return dns_name("job", job, max_length=58)


def portal_labels(owner: Owner, component: str, name: str) -> dict[str, str]:
    """The labels every object carries: who owns it and which portal object it belongs to."""
    return {
        "app.kubernetes.io/managed-by": MANAGED_BY,
        LABEL_WORKSPACE: owner.workspace,
        LABEL_INSTANCE: owner.instance,
        LABEL_COMPONENT: component,
        LABEL_NAME: name,
    }


def object_meta(name: str, labels: Mapping[str, str], namespace: str | None = None, **extra: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": dict(labels)}
    if namespace is not None:
        meta["namespace"] = namespace
    meta.update(extra)
    return meta


# -- quantities -------------------------------------------------------------------------------------------


def cpu_quantity(cores: float) -> str:
    """Whole cores as "4", fractions as millicores ("1500m")."""
    return str(int(cores)) if float(cores).is_integer() else f"{round(cores * 1000)}m"


def memory_quantity(gb: float) -> str:
    """GB read as GiB: "16Gi", or "1536Mi" for 1.5."""
    return f"{int(gb)}Gi" if float(gb).is_integer() else f"{round(gb * 1024)}Mi"


def gpu_resources(gpus: Decimal, gpu_type: str, settings: KubeSettings) -> dict[str, str]:
    """The extended resource and count for `gpus` GPUs: whole GPUs, or shares of one where configured."""
    if gpus <= 0:
        return {}
    if gpus == gpus.to_integral_value():
        return {settings.gpu_type_resources.get(gpu_type, settings.gpu_resource_name): str(int(gpus))}
    if settings.fractional_gpu_resource_name is None:
        raise UnsupportedRequest(
            f"{gpus.normalize():f} GPUs: this cluster has no shared-GPU resource (time-slicing or MIG) configured"
        )
    shares = math.ceil(gpus * settings.fractional_gpus_per_gpu)
    return {settings.fractional_gpu_resource_name: str(shares)}


def container_resources(size: Size, settings: KubeSettings) -> dict[str, dict[str, str]]:
    """Requests equal to limits (Guaranteed QoS); extended resources only in limits (requests default to them)."""
    base = {"cpu": cpu_quantity(size.cpu_cores), "memory": memory_quantity(size.memory_gb)}
    return {"requests": dict(base), "limits": {**base, **gpu_resources(size.gpus, size.gpu_type, settings)}}


def helper_resources() -> dict[str, dict[str, str]]:
    """What the portal's own helper pods (the vcluster installer running helm) ask for: little, and no more."""
    return {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"cpu": "500m", "memory": "512Mi"}}


def check_resources(container: Manifest) -> None:
    """``ValueError`` unless ``container`` requests and is limited to CPU and memory."""
    resources = container.get("resources") or {}
    for part in ("requests", "limits"):
        missing = [name for name in ("cpu", "memory") if not (resources.get(part) or {}).get(name)]
        if missing:
            raise ValueError(f"container {container.get('name')!r} has no {part} for {' and '.join(missing)}")


def _pod_placement(size: Size, settings: KubeSettings) -> dict[str, Any]:
    if size.gpus > 0 and size.gpu_type and settings.gpu_type_node_label:
        return {"nodeSelector": {settings.gpu_type_node_label: size.gpu_type}}
    return {}


# -- pod security -----------------------------------------------------------------------------------------


def pod_security_context(settings: KubeSettings) -> Manifest:
    """The pod-level half of the "restricted" profile: a non-root user and group, and RuntimeDefault seccomp."""
    return {
        "runAsNonRoot": True,
        "runAsUser": settings.pod_run_as_user,
        "runAsGroup": settings.pod_run_as_group,
        "fsGroup": settings.pod_fs_group,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container_security_context() -> Manifest:
    """The container-level half: no privilege, no escalation through setuid binaries, every capability dropped."""
    return {"privileged": False, "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def restricted_pod_spec(
    containers: Sequence[Manifest], settings: KubeSettings, *, service_account: str | None = None, **fields: Any
) -> Manifest:
    """A pod spec that passes the "restricted" Pod Security Standard; every pod of the portal's is built here.

    The pod runs as `settings.pod_run_as_user`/`pod_run_as_group` with `pod_fs_group`, each container gets
    `container_security_context()`, and no host namespace is shared (nothing sets hostNetwork, hostPID or
    hostIPC, and `fields` may not). Every container must request and limit its CPU and memory
    (`check_resources`; `ValueError` otherwise). The pod mounts a service-account token only when it names
    `service_account`; otherwise it has no credential for the API server. Service links stay off: a pod
    learns about other Services through DNS, not through its environment.
    """
    host = sorted({"hostNetwork", "hostPID", "hostIPC", "securityContext"} & set(fields))
    if host:
        raise ValueError(f"a portal pod may not set {', '.join(host)}")
    for container in [*containers, *fields.get("initContainers", [])]:
        check_resources(container)
    spec: Manifest = {
        **fields,
        "securityContext": pod_security_context(settings),
        "containers": [{**container, "securityContext": container_security_context()} for container in containers],
        "automountServiceAccountToken": service_account is not None,
        "enableServiceLinks": False,
    }
    if service_account is not None:
        spec["serviceAccountName"] = service_account
    return spec


# -- a namespace per instance -----------------------------------------------------------------------------


def pod_security_labels(settings: KubeSettings) -> dict[str, str]:
    """Pod Security Admission labels: enforce, audit and warn the "restricted" profile at the pinned version."""
    labels: dict[str, str] = {}
    for mode in POD_SECURITY_MODES:
        labels[f"pod-security.kubernetes.io/{mode}"] = POD_SECURITY_LEVEL
        labels[f"pod-security.kubernetes.io/{mode}-version"] = settings.pod_security_version
    return labels


def namespace(owner: Owner, settings: KubeSettings) -> Manifest:
    """A tenant's namespace; the API server rejects any pod in it that breaks the "restricted" profile."""
    labels = portal_labels(owner, "namespace", owner.instance) | pod_security_labels(settings)
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": object_meta(namespace_name(owner, settings), labels)}


def resource_quota(owner: Owner, profile: Size, settings: KubeSettings) -> Manifest:
    """The profile's size as the namespace's hard limits.

    Every GPU resource the settings know of is capped, at 0 unless the profile grants it: otherwise a
    namespace granted no GPUs could still ask for shared or MIG ones, which no quota would count.
    """
    cpu, memory = cpu_quantity(profile.cpu_cores), memory_quantity(profile.memory_gb)
    known = [settings.gpu_resource_name, *settings.gpu_type_resources.values()]
    if settings.fractional_gpu_resource_name:
        known.append(settings.fractional_gpu_resource_name)
    gpus = {resource: "0" for resource in known} | gpu_resources(profile.gpus, profile.gpu_type, settings)
    hard = {"requests.cpu": cpu, "limits.cpu": cpu, "requests.memory": memory, "limits.memory": memory}
    hard |= {f"requests.{resource}": count for resource, count in sorted(gpus.items())}
    hard["pods"] = str(settings.max_pods_per_namespace)
    return {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": object_meta(
            "gpuportal-quota", portal_labels(owner, "namespace", owner.instance), namespace_name(owner, settings)
        ),
        "spec": {"hard": hard},
    }


def limit_range(owner: Owner, profile: Size, settings: KubeSettings) -> Manifest:
    """Defaults for containers that name no resources (a quota on cpu/memory rejects such pods otherwise)."""
    item = {
        "type": "Container",
        "defaultRequest": {
            "cpu": cpu_quantity(min(0.25, profile.cpu_cores)),
            "memory": memory_quantity(min(0.5, profile.memory_gb)),
        },
        "default": {
            "cpu": cpu_quantity(min(1, profile.cpu_cores)),
            "memory": memory_quantity(min(1, profile.memory_gb)),
        },
        "max": {"cpu": cpu_quantity(profile.cpu_cores), "memory": memory_quantity(profile.memory_gb)},
    }
    return {
        "apiVersion": "v1",
        "kind": "LimitRange",
        "metadata": object_meta(
            "gpuportal-limits", portal_labels(owner, "namespace", owner.instance), namespace_name(owner, settings)
        ),
        "spec": {"limits": [item]},
    }


def service_account_name() -> str:
    return "gpuportal-user"


def role_binding(owner: Owner, usernames: Sequence[str], settings: KubeSettings) -> Manifest:
    """The workspace's users (and the namespace's kubeconfig service account) get `edit` in the namespace only."""
    ns = namespace_name(owner, settings)
    users = [
        {"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": f"{settings.username_prefix}{name}"}
        for name in sorted(set(usernames))
    ]
    account = {"kind": "ServiceAccount", "name": service_account_name(), "namespace": ns}
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": object_meta("gpuportal-edit", portal_labels(owner, "namespace", owner.instance), ns),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"},
        "subjects": [*users, account],
    }


def network_policy(owner: Owner, settings: KubeSettings) -> Manifest:
    """Default deny from other namespaces: every pod of the namespace accepts traffic from its own pods only.

    The empty `podSelector` selects every pod, so each one is isolated for ingress; the one rule's peer (a
    `podSelector` without a `namespaceSelector`) means "pods of this namespace". Traffic from other
    namespaces, the ingress controller's included, needs another policy that selects the pod (policies add up).
    Egress is not restricted: what a pod may reach is decided by the policies of where it goes.
    """
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": object_meta(
            NETWORK_POLICY_ISOLATE, portal_labels(owner, "namespace", owner.instance), namespace_name(owner, settings)
        ),
        "spec": {"podSelector": {}, "policyTypes": ["Ingress"], "ingress": [{"from": [{"podSelector": {}}]}]},
    }


def ingress_controller_network_policy(
    owner: Owner, settings: KubeSettings, name: str, pod_selector: Manifest, ports: list[Manifest] | None
) -> Manifest:
    """Lets the ingress controller's namespace (`ingress_namespace`) reach the pods `pod_selector` selects, on
    `ports` (None: any port). The namespace is matched by its name label, which only the API server sets."""
    rule: dict[str, Any] = {
        "from": [{"namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: settings.ingress_namespace}}}]
    }
    if ports is not None:
        rule["ports"] = ports
    labels = portal_labels(owner, "namespace", owner.instance)
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": object_meta(name, labels, namespace_name(owner, settings)),
        "spec": {"podSelector": pod_selector, "policyTypes": ["Ingress"], "ingress": [rule]},
    }


def notebook_ingress_network_policy(owner: Owner, settings: KubeSettings) -> Manifest:
    """The ingress controller's namespace (`ingress_namespace`) may reach the notebooks' Jupyter port, and
    nothing else of this namespace: other pods stay reachable from their own namespace only."""
    selector = {"matchLabels": {"app.kubernetes.io/managed-by": MANAGED_BY, LABEL_COMPONENT: "notebook"}}
    ports = [{"protocol": "TCP", "port": JUPYTER_PORT}]
    return ingress_controller_network_policy(owner, settings, NETWORK_POLICY_NOTEBOOK_INGRESS, selector, ports)


def service_account(owner: Owner, settings: KubeSettings) -> Manifest:
    """The namespace's account for kubeconfigs; no pod gets its token unless the pod asks for it by name."""
    ns = namespace_name(owner, settings)
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": object_meta(service_account_name(), portal_labels(owner, "namespace", owner.instance), ns),
        "automountServiceAccountToken": False,
    }


def service_account_token_secret(owner: Owner, settings: KubeSettings) -> Manifest:
    """A long-lived token for the service account; the token controller fills in `token` and `ca.crt`."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "kubernetes.io/service-account-token",
        "metadata": object_meta(
            f"{service_account_name()}-token",
            portal_labels(owner, "namespace", owner.instance),
            namespace_name(owner, settings),
            annotations={"kubernetes.io/service-account.name": service_account_name()},
        ),
    }


def namespace_objects(owner: Owner, profile: Size, usernames: Sequence[str], settings: KubeSettings) -> list[Manifest]:
    """Everything an instance of kind "namespace" is, in the order to create it (the Namespace first)."""
    return [
        namespace(owner, settings),
        resource_quota(owner, profile, settings),
        limit_range(owner, profile, settings),
        network_policy(owner, settings),
        notebook_ingress_network_policy(owner, settings),
        service_account(owner, settings),
        service_account_token_secret(owner, settings),
        role_binding(owner, usernames, settings),
    ]


def kubeconfig(*, username: str, server: str, ca_data: str, token: str, namespace: str) -> Manifest:
    """A kubeconfig for `username` into one namespace.

    `ca_data` is base64 PEM, as in the token Secret's `data["ca.crt"]`; `token` is the decoded token.
    """
    context = f"{username}@{namespace}"
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "gpuportal", "cluster": {"server": server, "certificate-authority-data": ca_data}}],
        "users": [{"name": username, "user": {"token": token}}],
        "contexts": [{"name": context, "context": {"cluster": "gpuportal", "user": username, "namespace": namespace}}],
        "current-context": context,
        "preferences": {},
    }


# -- notebooks --------------------------------------------------------------------------------------------


def notebook_base_url(owner: Owner, notebook: str) -> str:
    return f"/notebooks/{owner.workspace}/{notebook}/"


def notebook_host(owner: Owner, notebook: str, settings: KubeSettings) -> str | None:
    """The host a notebook's Ingress matches: one per notebook in host mode, the shared one in path mode."""
    if settings.ingress_mode == "path":
        return settings.ingress_host
    if not settings.ingress_host:
        raise UnsupportedRequest("host-based notebook ingress needs KubeSettings.ingress_host (the parent domain)")
    return f"{dns_name(notebook, owner.workspace)}.{settings.ingress_host}"


def notebook_url(owner: Owner, notebook: str, settings: KubeSettings, base_url: str | None = None) -> str:
    """Where the browser opens the notebook (the token still has to be given)."""
    host = notebook_host(owner, notebook, settings) or "<portal-host>"
    scheme = "https" if settings.ingress_tls_secret else "http"
    return f"{scheme}://{host}{base_url or notebook_base_url(owner, notebook)}"


def portal_env_vars(portal_env: Mapping[str, str] | None, secret: str) -> list[dict[str, Any]]:
    """A container's GPUPORTAL_* variables (its SDK's URL, workspace and credential): the credential read from
    the Secret `secret` (under PORTAL_TOKEN_KEY), never a plain value in a manifest."""
    token_ref = {"secretKeyRef": {"name": secret, "key": PORTAL_TOKEN_KEY}}
    return [
        {"name": key, "valueFrom": token_ref} if key == PORTAL_TOKEN_ENV else {"name": key, "value": value}
        for key, value in sorted((portal_env or {}).items())
    ]


def _portal_token_data(portal_env: Mapping[str, str] | None) -> dict[str, str]:
    token = (portal_env or {}).get(PORTAL_TOKEN_ENV)
    return {PORTAL_TOKEN_KEY: token} if token else {}


def notebook_token_secret(
    owner: Owner, notebook: str, token: str, settings: KubeSettings, portal_env: Mapping[str, str] | None = None
) -> Manifest:
    """The notebook server's token, and its portal credential where it has one."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": object_meta(
            notebook_token_secret_name(notebook),
            portal_labels(owner, "notebook", notebook),
            namespace_name(owner, settings),
        ),
        "stringData": {TOKEN_KEY: token, **_portal_token_data(portal_env)},
    }


def _notebook_container(
    owner: Owner,
    notebook: str,
    image: str,
    size: Size,
    settings: KubeSettings,
    base_url: str | None,
    portal_env: Mapping[str, str] | None = None,
) -> Manifest:
    base_url = base_url or notebook_base_url(owner, notebook)
    token_ref = {"secretKeyRef": {"name": notebook_token_secret_name(notebook), "key": TOKEN_KEY}}
    return {
        "name": "notebook",
        "image": image,
        # jupyter_server reads JUPYTER_TOKEN itself: the token never appears on a command line.
        "command": [
            "jupyter",
            "server",
            "--ip=0.0.0.0",
            f"--port={JUPYTER_PORT}",
            "--no-browser",
            f"--ServerApp.base_url={base_url}",
            "--ServerApp.default_url=/lab",  # the Jupyter images have JupyterLab: open it
            "--LabApp.news_url=None",  # no prompt about Jupyter news; nothing fetched from outside
            "--ServerApp.trust_xheaders=True",
        ],
        "env": [
            {"name": "JUPYTER_TOKEN", "valueFrom": token_ref},
            *portal_env_vars(portal_env, notebook_token_secret_name(notebook)),
        ],
        "ports": [{"name": "http", "containerPort": JUPYTER_PORT}],
        "resources": container_resources(size, settings),
        # /api answers without a token once the server is up.
        "readinessProbe": {"httpGet": {"path": f"{base_url}api", "port": "http"}, "periodSeconds": 5},
    }


def notebook_stateful_set(
    owner: Owner,
    notebook: str,
    image: str,
    size: Size,
    settings: KubeSettings,
    base_url: str | None = None,
    service_account: str | None = None,
    portal_env: Mapping[str, str] | None = None,
) -> Manifest:
    """One Jupyter server pod; a StatefulSet so a deleted pod comes back with the same name and DNS.

    `base_url` is where the server is served (default: `notebook_base_url`). The pod mounts the token of
    `service_account` where one is named, and no token otherwise. `portal_env`: its GPUPORTAL_* variables.
    """
    name, labels = notebook_name(notebook), portal_labels(owner, "notebook", notebook)
    pod_spec = restricted_pod_spec(
        [_notebook_container(owner, notebook, image, size, settings, base_url, portal_env)],
        settings,
        service_account=service_account,
        **_pod_placement(size, settings),
    )
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": object_meta(name, labels, namespace_name(owner, settings)),
        "spec": {
            "replicas": 1,
            "serviceName": name,
            "selector": {"matchLabels": dict(labels)},
            "template": {"metadata": {"labels": dict(labels)}, "spec": pod_spec},
        },
    }


def notebook_service(owner: Owner, notebook: str, settings: KubeSettings) -> Manifest:
    name, labels = notebook_name(notebook), portal_labels(owner, "notebook", notebook)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": object_meta(name, labels, namespace_name(owner, settings)),
        "spec": {
            "selector": dict(labels),
            "ports": [{"name": "http", "port": JUPYTER_PORT, "targetPort": "http", "protocol": "TCP"}],
        },
    }


def notebook_ingress(owner: Owner, notebook: str, settings: KubeSettings, base_url: str | None = None) -> Manifest:
    """Routes the notebook's base URL to its Service, on the shared host (path mode) or its own (host mode)."""
    host = notebook_host(owner, notebook, settings)
    backend = {"service": {"name": notebook_name(notebook), "port": {"name": "http"}}}
    path = {"path": base_url or notebook_base_url(owner, notebook), "pathType": "Prefix", "backend": backend}
    rule: dict[str, Any] = {"http": {"paths": [path]}}
    if host:
        rule["host"] = host
    spec: dict[str, Any] = {"ingressClassName": settings.ingress_class_name, "rules": [rule]}
    if settings.ingress_tls_secret:
        spec["tls"] = [{"secretName": settings.ingress_tls_secret, **({"hosts": [host]} if host else {})}]
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "Ingress",
        "metadata": object_meta(
            notebook_name(notebook), portal_labels(owner, "notebook", notebook), namespace_name(owner, settings)
        ),
        "spec": spec,
    }


def notebook_objects(
    owner: Owner,
    notebook: str,
    *,
    image: str,
    size: Size,
    token: str,
    settings: KubeSettings,
    base_url: str | None = None,
    service_account: str | None = None,
    portal_env: Mapping[str, str] | None = None,
) -> list[Manifest]:
    """A notebook, in the order to create it (the token Secret before the pod that reads it).

    `service_account`: the account whose token the notebook's pod mounts; None (the default) mounts none.
    `portal_env`: the notebook's GPUPORTAL_* variables, its portal credential kept in the token Secret.
    """
    return [
        notebook_token_secret(owner, notebook, token, settings, portal_env),
        notebook_service(owner, notebook, settings),
        notebook_stateful_set(owner, notebook, image, size, settings, base_url, service_account, portal_env),
        notebook_ingress(owner, notebook, settings, base_url),
    ]


# -- jobs -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GangJob:
    """A job as the portal admitted it: `replicas` pods of `size` each, all started together.

    `service_account` is the account whose token its pods mount; None (the default) mounts none.
    `portal_env`: its GPUPORTAL_* variables (set over `env`), its portal credential kept in a Secret of its own.
    """

    name: str
    image: str
    command: str
    size: Size
    replicas: int = 1
    env: Mapping[str, str] | None = None
    max_runtime_s: int | None = None
    service_account: str | None = None
    portal_env: Mapping[str, str] | None = None


def master_address(job: str) -> str:
    """Rank 0's DNS name inside the namespace: "<job>-0.<headless service>"."""
    return f"{job_name(job)}-0.{job_name(job)}"


def _gang_env(spec: GangJob, settings: KubeSettings) -> list[dict[str, Any]]:
    reserved = sorted(set(spec.env or {}) & set(GANG_ENV))
    if reserved:
        raise UnsupportedRequest(f"these environment variables are set by the portal: {', '.join(reserved)}")
    portal = spec.portal_env or {}
    user = [{"name": key, "value": value} for key, value in sorted((spec.env or {}).items()) if key not in portal]
    index_ref = {"fieldRef": {"fieldPath": f"metadata.annotations['{JOB_INDEX_ANNOTATION}']"}}
    return [
        *user,
        *portal_env_vars(portal, job_portal_secret_name(spec.name)),
        {"name": "RANK", "valueFrom": index_ref},
        {"name": "WORLD_SIZE", "value": str(spec.replicas)},
        {"name": "MASTER_ADDR", "value": master_address(spec.name)},
        {"name": "MASTER_PORT", "value": str(settings.master_port)},
    ]


def job(owner: Owner, spec: GangJob, settings: KubeSettings) -> Manifest:
    """An indexed Job created suspended: its pods only exist once the portal admits the whole gang.

    backoffLimit 0 and no podFailurePolicy: a gang with one failed rank is broken, so the Job fails and the
    portal (which owns retries and requeueing) decides what happens next, rather than Kubernetes restarting one
    rank into a rendezvous that the others have left.
    """
    name, labels = job_name(spec.name), portal_labels(owner, "job", spec.name)
    container = {
        "name": "main",
        "image": spec.image,
        "command": ["/bin/sh", "-c", spec.command],
        "env": _gang_env(spec, settings),
        "ports": [{"name": "rendezvous", "containerPort": settings.master_port}],
        "resources": container_resources(spec.size, settings),
    }
    pod_spec = restricted_pod_spec(
        [container],
        settings,
        service_account=spec.service_account,
        restartPolicy="Never",
        subdomain=name,
        **_pod_placement(spec.size, settings),
    )
    job_spec: dict[str, Any] = {
        "completionMode": "Indexed",
        "completions": spec.replicas,
        "parallelism": spec.replicas,
        "suspend": True,
        "backoffLimit": 0,
        "ttlSecondsAfterFinished": settings.job_ttl_after_finished_s,
        "template": {"metadata": {"labels": dict(labels)}, "spec": pod_spec},
    }
    if spec.max_runtime_s:
        job_spec["activeDeadlineSeconds"] = spec.max_runtime_s
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": object_meta(name, labels, namespace_name(owner, settings)),
        "spec": job_spec,
    }


def job_service(owner: Owner, spec: GangJob, settings: KubeSettings) -> Manifest:
    """Headless Service that gives each pod of the gang the DNS name "<job>-<index>.<job>"."""
    name, labels = job_name(spec.name), portal_labels(owner, "job", spec.name)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": object_meta(name, labels, namespace_name(owner, settings)),
        "spec": {
            "clusterIP": "None",
            "selector": dict(labels),
            # Rank 0 must resolve while the gang is still rendezvousing, before anything is "ready".
            "publishNotReadyAddresses": True,
            "ports": [{"name": "rendezvous", "port": settings.master_port, "protocol": "TCP"}],
        },
    }


def job_portal_secret(owner: Owner, spec: GangJob, settings: KubeSettings) -> Manifest:
    """The job's portal credential, which its pods read into GPUPORTAL_TOKEN."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": object_meta(
            job_portal_secret_name(spec.name), portal_labels(owner, "job", spec.name), namespace_name(owner, settings)
        ),
        "stringData": _portal_token_data(spec.portal_env),
    }


def job_objects(owner: Owner, spec: GangJob, settings: KubeSettings) -> list[Manifest]:
    """A job, in the order to create it (its credential's Secret and the Service first, so that they exist
    before any pod)."""
    secret = [job_portal_secret(owner, spec, settings)] if _portal_token_data(spec.portal_env) else []
    return [*secret, job_service(owner, spec, settings), job(owner, spec, settings)]


def jobs_namespace_objects(workspace: str, settings: KubeSettings) -> list[Manifest]:
    """A workspace's jobs namespace: the Namespace and its isolating NetworkPolicy (no notebooks live here,
    so nothing in it is reachable from the ingress controller).

    No ResourceQuota: the portal admits jobs under the workspace's quota before they reach the cluster.
    """
    owner = jobs_owner(workspace, settings)
    return [namespace(owner, settings), network_policy(owner, settings)]


def job_release_patch() -> Manifest:
    """JSON merge patch (application/merge-patch+json) that lets an admitted, suspended Job start its pods."""
    return {"spec": {"suspend": False}}
