"""The Kubernetes backend: instances as namespaces or vclusters, notebooks as StatefulSets, jobs as indexed Jobs,
Ray clusters as KubeRay RayClusters (or RayJobs, for an entrypoint), inference replicas as Pods of their server
behind their endpoint's headless Service (``kubernetes_inference``).

Every object comes from the pure builders of ``kubernetes_objects`` (``kuberay_objects`` for Ray) and goes to the
API server through the official ``kubernetes`` client, one typed call per object (``create_namespaced_job`` and
so on; KubeRay's through ``CustomObjectsApi``). Responses
are read as the API server's own JSON (``_preload_content=False``), never through the client's models.

Idempotence. A create answered 409 (AlreadyExists) reads the object and goes on: it is refused if it is not
the portal's or belongs to another workspace, it is a transient error while it is being deleted, and it is
merge-patched to the manifest (Jobs excepted: their template is immutable, and the patch would suspend a
released gang again; RayJobs too: KubeRay runs a RayJob once). A delete answered 404 is done.

Errors. A 403 for an exceeded quota is a ``PolicyRefusal`` with the API server's message; a request the
builders cannot express (a fraction of a GPU without a shared-GPU resource) is one too. Other 4xx answers
(invalid, forbidden, unauthorized) are permanent ``BackendError``; 409 conflicts, 408, 429, 5xx and
connection errors are transient.

Isolation: every namespace enforces Pod Security "restricted", every pod passes it and mounts no
service-account token unless its spec sets ``service_account_token``, and every namespace admits traffic from
its own pods only (notebooks also from the ingress controller's namespace; a Ray cluster's pods only from that
cluster's, its dashboard also from the ingress controller's namespace); see docs/kubernetes.md.

Configuration: an explicit ``api_client`` or ``host`` (tests), else the pod's service account (in-cluster),
else a kubeconfig (``kubeconfig`` path and ``context``, or the client's defaults). The backends of one API server
share a client in each process. A reconcile pass reads its running workloads from one LIST per kind of object and
namespace (``polling()``), not an object each.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import hashlib
import json
import logging
import math
import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextvars import ContextVar
from decimal import Decimal
from typing import Any
from urllib.parse import urlsplit

import urllib3
import yaml
from kubernetes import client, config
from kubernetes.utils import parse_quantity

from workers.backends import kuberay_objects as kro
from workers.backends import kubernetes_inference as ki
from workers.backends import kubernetes_objects as ko
from workers.backends import kubernetes_reservations as kr
from workers.backends import kubernetes_vcluster as kv
from workers.backends.base import (
    STATE_VERSION,
    STOPPED_EXIT_CODE,
    TIMEOUT_EXIT_CODE,
    UNKNOWN_EXIT_CODE,
    Backend,
    BackendError,
    Endpoint,
    GpuInfo,
    InferenceSpec,
    InstanceSpec,
    JobSpec,
    Keep,
    NodeGroup,
    NodeInfo,
    NotebookSpec,
    PolicyRefusal,
    Progress,
    RayClusterSpec,
    Spec,
    Status,
    last_progress,
    validate_spec,
)

MERGE_PATCH = "application/merge-patch+json"
LOG_CHUNK = 1 << 20
PROGRESS_TAIL_LINES = 500
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
JOB_INDEX_LABEL = "batch.kubernetes.io/job-completion-index"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_MEMORY_LABEL = "nvidia.com/gpu.memory"  # MiB, from NVIDIA's GPU feature discovery

# kind -> (client API class, the suffix of its create_/read_/patch_/delete_ methods)
_RESOURCES: dict[str, tuple[type[Any], str]] = {
    "Namespace": (client.CoreV1Api, "namespace"),
    "ResourceQuota": (client.CoreV1Api, "namespaced_resource_quota"),
    "LimitRange": (client.CoreV1Api, "namespaced_limit_range"),
    "ServiceAccount": (client.CoreV1Api, "namespaced_service_account"),
    "Secret": (client.CoreV1Api, "namespaced_secret"),
    "ConfigMap": (client.CoreV1Api, "namespaced_config_map"),
    "Service": (client.CoreV1Api, "namespaced_service"),
    "Pod": (client.CoreV1Api, "namespaced_pod"),
    "PersistentVolumeClaim": (client.CoreV1Api, "namespaced_persistent_volume_claim"),
    "NetworkPolicy": (client.NetworkingV1Api, "namespaced_network_policy"),
    "Ingress": (client.NetworkingV1Api, "namespaced_ingress"),
    "RoleBinding": (client.RbacAuthorizationV1Api, "namespaced_role_binding"),
    "StatefulSet": (client.AppsV1Api, "namespaced_stateful_set"),
    "Job": (client.BatchV1Api, "namespaced_job"),
}
# KubeRay's custom resources: kind -> (group, version, plural), called through the client's CustomObjectsApi.
_CUSTOM: dict[str, tuple[str, str, str]] = {
    "RayCluster": (kro.RAY_API_GROUP, kro.RAY_API_VERSION, kro.RAY_CLUSTER_PLURAL),
    "RayJob": (kro.RAY_API_GROUP, kro.RAY_API_VERSION, kro.RAY_JOB_PLURAL),
}
_CUSTOM_VERBS = {"create": "create", "read": "get", "patch": "patch", "delete": "delete", "list": "list"}
# The client's configuration loaders and its quantity parser carry no annotations.
_load_incluster_config: Callable[..., None] = config.load_incluster_config
_load_kube_config: Callable[..., None] = config.load_kube_config
_parse_quantity: Callable[[Any], Decimal] = parse_quantity
# Deleting these waits for their pods (Foreground); the rest go at once, their dependents after (Background).
_FOREGROUND = frozenset({"Job", "StatefulSet", "RayCluster", "RayJob"})
# Every object the portal creates carries this label (pods through their templates): what a pass's LISTs select.
_PORTAL_SELECTOR = f"app.kubernetes.io/managed-by={ko.MANAGED_BY}"
#: Within ``KubernetesBackend.polling``: what the pass's LISTs found, by API server (``KubernetesBackend._server``).
_POLLED: ContextVar[dict[tuple[Any, ...], _Listed] | None] = ContextVar("kubernetes_polled", default=None)
# One API client per API server and credentials in a process, shared by the backends built for its workloads (a
# reconcile pass builds one for each): one connection pool, the configuration (kubeconfig, service account) read
# once. Built again once this old, so that credentials renewed on disk are read again (tokens the client
# refreshes by itself: the service account's, an exec plugin's).
_CLIENT_MAX_AGE_S = 600.0
_CLIENTS_MAX = 16
_CLIENTS: dict[tuple[Any, ...], tuple[float, client.ApiClient]] = {}
_CLIENTS_LOCK = threading.Lock()
# Connections already checked (``from_connection``), by their JSON: the settings and options each gives.
_CONNECTIONS: dict[str, tuple[ko.KubeSettings, dict[str, Any]]] = {}

logger = logging.getLogger(__name__)

_BACKEND_OPTIONS = (
    "host",
    "kubeconfig",
    "context",
    "server_url",
    "vcluster_server_url",
    "default_job_image",
    "default_notebook_image",
    "default_ray_image",
    "kuberay_operator_namespace",
    "start_timeout_s",
    "stop_timeout_s",
    "request_timeout_s",
)


def api_error(exc: client.ApiException) -> BackendError | PolicyRefusal:
    """The error a failed API call means for the caller (see the module docstring)."""
    status = int(exc.status or 0)
    message = _api_message(exc)
    if status == 403 and "exceeded quota" in message:
        return PolicyRefusal(f"the cluster's quota refused it: {message}")
    transient = status in (0, 408, 409, 429) or status >= 500 or "being terminated" in message
    return BackendError(f"Kubernetes API answered {status}: {message}", permanent=not transient)


def _api_message(exc: client.ApiException) -> str:
    try:
        body = json.loads(exc.body or "")
    except ValueError:
        body = None
    if isinstance(body, dict) and body.get("message"):
        return str(body["message"])
    return str(exc.reason or "no message")


def _ref(manifest: ko.Manifest) -> dict[str, str]:
    meta = manifest["metadata"]
    return {"kind": manifest["kind"], "name": meta["name"], "namespace": meta.get("namespace", "")}


def _condition(obj: Mapping[str, Any], kind: str) -> dict[str, Any] | None:
    for condition in obj.get("status", {}).get("conditions") or []:
        if condition.get("type") == kind and condition.get("status") == "True":
            return dict(condition)
    return None


def _portal_object(obj: Mapping[str, Any]) -> bool:
    return (obj.get("metadata", {}).get("labels") or {}).get("app.kubernetes.io/managed-by") == ko.MANAGED_BY


def _lists_for(state: Mapping[str, Any]) -> set[tuple[str, str]]:
    """The (kind, namespace) LISTs that a running workload's ``poll()`` and ``progress()`` read from: its object's
    kind in its namespace ("" for Namespaces), and its pods where it reads them; none once it ended."""
    namespace = state.get("namespace") if state else None
    if not isinstance(namespace, str) or state.get("final"):
        return set()
    kind, ray_kind = state.get("kind"), state.get("ray_kind")
    if kind == "job":
        return {("Job", namespace), ("Pod", namespace)}
    if kind == "notebook":
        return {("StatefulSet", namespace)}
    if kind == "inference":
        return {("Pod", namespace)}
    if kind == "instance":
        return {("Namespace", "")} | ({("Job", namespace)} if state.get("instance_kind") == "vcluster" else set())
    if kind == "ray" and ray_kind in _CUSTOM:
        return {(ray_kind, namespace)} | ({("Pod", namespace)} if ray_kind == "RayJob" else set())
    return set()


class _Listed:
    """What one pass's LISTs found on an API server: for each (kind, namespace) listed ("" for the cluster-scoped
    Namespaces), the portal's objects there by name."""

    def __init__(self, found: dict[tuple[str, str], dict[str, dict[str, Any]]]) -> None:
        self.found = found
        self._pods_by: dict[tuple[str, str], dict[str, list[dict[str, Any]]]] = {}

    def pods(self, namespace: str, labels: Mapping[str, str], by: str) -> list[dict[str, Any]] | None:
        """The listed pods of ``namespace`` with ``labels``, found through an index on the label ``by`` (one of
        them: a pass looks up each workload's pods among all of a namespace's); None where none were listed."""
        if ("Pod", namespace) not in self.found:
            return None
        if (namespace, by) not in self._pods_by:
            index: dict[str, list[dict[str, Any]]] = {}
            for pod in self.found[("Pod", namespace)].values():
                value = (pod["metadata"].get("labels") or {}).get(by)
                if value is not None:
                    index.setdefault(value, []).append(pod)
            self._pods_by[(namespace, by)] = index
        found = self._pods_by[(namespace, by)].get(labels[by], [])
        return [pod for pod in found if labels.items() <= (pod["metadata"].get("labels") or {}).items()]


def _shared_client(key: tuple[Any, ...], configure: Callable[[], client.Configuration]) -> client.ApiClient:
    """The process's API client for ``key``, built with ``configure()`` where there is none or it is too old."""
    now = time.monotonic()
    with _CLIENTS_LOCK:
        for old in [k for k, (built, _) in _CLIENTS.items() if now - built > _CLIENT_MAX_AGE_S]:
            del _CLIENTS[old]
        if key not in _CLIENTS:
            while len(_CLIENTS) >= _CLIENTS_MAX:
                del _CLIENTS[next(iter(_CLIENTS))]  # the oldest
            _CLIENTS[key] = (now, client.ApiClient(configure()))
        return _CLIENTS[key][1]


def _checked_connection(connection: Mapping[str, Any]) -> tuple[ko.KubeSettings, dict[str, Any]]:
    """A cluster's ``connection`` as ``KubeSettings`` and the backend's other options; see ``from_connection()``."""
    fields = {f.name: f for f in dataclasses.fields(ko.KubeSettings)}
    unknown = sorted(set(connection) - set(fields) - set(_BACKEND_OPTIONS))
    if unknown:
        raise BackendError(f"unknown Kubernetes connection settings: {', '.join(unknown)}", permanent=True)
    defaults = ko.KubeSettings()
    for key, value in connection.items():
        expected = type(getattr(defaults, key)) if key in fields else None
        if expected is not None and getattr(defaults, key) is not None and not isinstance(value, expected):
            raise BackendError(f"connection setting {key} must be a {expected.__name__}", permanent=True)
    if connection.get("ingress_mode", "path") not in ("path", "host"):
        raise BackendError("connection setting ingress_mode must be 'path' or 'host'", permanent=True)
    try:
        settings = ko.KubeSettings(**{k: v for k, v in connection.items() if k in fields})
    except ko.InvalidSettings as exc:
        raise BackendError(f"connection settings: {exc}", permanent=True) from exc
    options = {k: v for k, v in connection.items() if k in _BACKEND_OPTIONS}
    operator_namespace = options.get("kuberay_operator_namespace", kro.DEFAULT_OPERATOR_NAMESPACE)
    if not isinstance(operator_namespace, str) or not re.match(
        r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$", operator_namespace
    ):
        raise BackendError("connection setting kuberay_operator_namespace must be a namespace name", permanent=True)
    for key in ("start_timeout_s", "stop_timeout_s", "request_timeout_s"):
        if key in options and (not isinstance(options[key], int | float) or options[key] <= 0):
            raise BackendError(f"connection setting {key} must be a positive number", permanent=True)
    return settings, options


def _workload_name(key: str) -> str:
    """A workload key as a DNS label short enough for the Job's pods' hostnames and for label values."""
    clean = re.sub(r"[^a-z0-9-]+", "-", key.lower()).strip("-")
    if clean == key and len(clean) <= 40:
        return clean
    return f"{clean[:29].rstrip('-') or 'w'}-{hashlib.sha256(key.encode()).hexdigest()[:10]}"


class KubernetesBackend(Backend):
    """Runs one workload on a Kubernetes cluster; the kinds it runs are described in docs/kubernetes.md.

    ``settings`` are the cluster's ``KubeSettings`` (ingress, GPU resources, name prefix...).
    ``server_url`` is the API server URL written into users' kubeconfigs (default: the one the portal
    uses); ``vcluster_server_url`` the URL a vcluster's kubeconfig names, with ``{release}`` and
    ``{namespace}`` filled in. ``start_timeout_s`` bounds the wait for a gang's pods or a notebook to be
    ready; ``stop_timeout_s`` the wait for deleted objects to be gone. ``poll_interval_s`` paces both.
    A job has no artifacts here (the contract's default): its files live in its pods' volumes, which the
    portal does not read.

    ``adopt()`` keeps the contract's default (``None``): the objects are labelled with their workspace,
    instance, component and name, not with the workload's key, and nothing tells the objects of a start
    that was never recorded from those of an earlier attempt that was. A repeated ``start()`` finds a
    running workload by its objects' names and converges on it; a Job under the name that has ended, be
    it of an earlier attempt or of the start that was lost, is deleted and run again.
    """

    name = "kubernetes"

    def __init__(
        self,
        *,
        settings: ko.KubeSettings | None = None,
        api_client: client.ApiClient | None = None,
        host: str | None = None,
        kubeconfig: str | None = None,
        context: str | None = None,
        server_url: str | None = None,
        vcluster_server_url: str = "https://{release}.{namespace}.svc",
        default_job_image: str = "python:3.12-slim",
        default_notebook_image: str = "quay.io/jupyter/minimal-notebook:latest",
        default_ray_image: str = kro.DEFAULT_RAY_IMAGE,
        kuberay_operator_namespace: str = kro.DEFAULT_OPERATOR_NAMESPACE,
        start_timeout_s: float = 300.0,
        stop_timeout_s: float = 120.0,
        request_timeout_s: float = 30.0,
        poll_interval_s: float = 1.0,
    ) -> None:
        self.settings = settings or ko.KubeSettings()
        self.host = host
        self.kubeconfig_path = kubeconfig
        self.context = context
        self.server_url = server_url
        self.vcluster_server_url = vcluster_server_url
        self.default_job_image = default_job_image
        self.default_notebook_image = default_notebook_image
        self.default_ray_image = default_ray_image
        self.kuberay_operator_namespace = kuberay_operator_namespace
        self.start_timeout_s = start_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.request_timeout_s = request_timeout_s
        self.poll_interval_s = poll_interval_s
        self._client = api_client
        # Which API server and credentials: backends with the same share an API client and a pass's LISTs.
        self._server: tuple[Any, ...] = (
            ("client", id(api_client)) if api_client is not None else (host, kubeconfig, context)
        )
        self._apis: dict[type[Any], Any] = {}
        self._state: dict[str, Any] = {}

    @classmethod
    def from_connection(cls, connection: Mapping[str, Any]) -> KubernetesBackend:
        """A backend configured from a cluster's ``connection`` (backend options and ``KubeSettings`` fields).

        An unknown key or a value of the wrong type is a permanent ``BackendError``. A connection is checked once
        per process: a reconcile pass builds a backend for each of its workloads.
        """
        key = json.dumps(connection, sort_keys=True, default=repr)
        checked = _CONNECTIONS.get(key)
        if checked is None:
            checked = _checked_connection(connection)
            if len(_CONNECTIONS) >= 64:
                _CONNECTIONS.clear()
            _CONNECTIONS[key] = checked
        settings, options = checked
        return cls(settings=settings, **options)

    # -- the API -------------------------------------------------------------------------------

    def _api_client(self) -> client.ApiClient:
        if self._client is None:
            self._client = _shared_client((os.getpid(), *self._server), self._configuration)
        return self._client

    def _configuration(self) -> client.Configuration:
        configuration = client.Configuration()
        if self.host:
            configuration.host = self.host
            return configuration
        try:
            _load_incluster_config(client_configuration=configuration)
            return configuration
        except config.ConfigException:
            pass
        try:
            _load_kube_config(
                config_file=self.kubeconfig_path,
                context=self.context,
                client_configuration=configuration,
                persist_config=False,
            )
        except (config.ConfigException, OSError) as exc:
            raise BackendError(
                f"no Kubernetes API: not in a cluster, and no usable kubeconfig: {exc}", permanent=True
            ) from exc
        return configuration

    def _call(self, kind: str, verb: str, *args: Any, ok: tuple[int, ...] = (), **kwargs: Any) -> bytes | None:
        """Call ``<verb>_<kind's suffix>`` (``create_namespaced_job``...); see ``_invoke``. A KubeRay kind goes
        through ``<verb>_namespaced_custom_object`` with the same arguments as a namespaced kind's
        (``create(namespace, body)``, ``read/delete(name, namespace)``, ``patch(name, namespace, body)``,
        ``list(namespace)``)."""
        if kind in _CUSTOM:
            group, version, plural = _CUSTOM[kind]
            if verb in ("create", "list"):
                namespace, *rest = args
            else:
                name, namespace, *rest = args
                rest = [name, *rest]
            method = f"{_CUSTOM_VERBS[verb]}_namespaced_custom_object"
            return self._invoke(
                client.CustomObjectsApi, method, group, version, namespace, plural, *rest, ok=ok, **kwargs
            )
        api_class, suffix = _RESOURCES[kind]
        return self._invoke(api_class, f"{verb}_{suffix}", *args, ok=ok, **kwargs)

    def _invoke(
        self, api_class: type[Any], method_name: str, *args: Any, ok: tuple[int, ...] = (), **kwargs: Any
    ) -> bytes | None:
        """Call one method of the client and return the response body; None for an ``ok`` error status."""
        if api_class not in self._apis:
            self._apis[api_class] = api_class(self._api_client())
        method: Callable[..., Any] = getattr(self._apis[api_class], method_name)
        try:
            response = method(*args, _preload_content=False, _request_timeout=self.request_timeout_s, **kwargs)
        except client.ApiException as exc:
            if exc.status in ok:
                return None
            raise api_error(exc) from exc
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise BackendError(f"the Kubernetes API could not be reached: {exc}", permanent=False) from exc
        data: bytes = response.data
        return data

    def _json_call(self, kind: str, verb: str, *args: Any, ok: tuple[int, ...] = (), **kwargs: Any) -> Any:
        data = self._call(kind, verb, *args, ok=ok, **kwargs)
        if data is None:
            return None
        try:
            return json.loads(data)
        except ValueError as exc:
            raise BackendError(
                f"the Kubernetes API sent a body that is not JSON: {data[:200]!r}", permanent=False
            ) from exc

    @staticmethod
    def _scope(ref: Mapping[str, str]) -> list[str]:
        return [ref["name"], ref["namespace"]] if ref.get("namespace") else [ref["name"]]

    def _read(self, ref: Mapping[str, str]) -> dict[str, Any] | None:
        """The object as the API server has it, or None if it does not exist."""
        obj = self._json_call(ref["kind"], "read", *self._scope(ref), ok=(404,))
        return dict(obj) if obj is not None else None

    def _list(self, kind: str, namespace: str, labels: Mapping[str, str]) -> list[dict[str, Any]]:
        """Objects of `kind` in `namespace` with these labels (checked here too, whatever the server filtered)."""
        selector = ",".join(f"{k}={v}" for k, v in labels.items())
        answer = self._json_call(kind, "list", namespace, label_selector=selector) or {}
        items = [dict(item) for item in answer.get("items") or []]
        return [i for i in items if labels.items() <= (i.get("metadata", {}).get("labels") or {}).items()]

    def _list_all(self, kind: str, namespace: str) -> dict[str, dict[str, Any]]:
        """The portal's objects of ``kind`` in ``namespace`` ("" for Namespaces) by name, from one LIST selecting
        the label they all carry (checked here too); none where the API server does not know the kind (KubeRay's
        CRDs not installed), as a read of one of them would say."""
        answer = self._json_call(
            kind, "list", *([namespace] if namespace else []), label_selector=_PORTAL_SELECTOR, ok=(404,)
        )
        items = [dict(item) for item in (answer or {}).get("items") or [] if _portal_object(item)]
        return {str(item["metadata"].get("name", "")): item for item in items}

    def _polled(self) -> _Listed | None:
        """What this pass's LISTs found on this API server (see ``polling()``); None outside a pass."""
        return (_POLLED.get() or {}).get(self._server)

    def _current(self, ref: Mapping[str, str]) -> dict[str, Any] | None:
        """The portal's object ``ref``, as this pass's LIST of its kind and namespace found it, else as the API server
        has it now; None where there is none (an object under the name that is not the portal's is none)."""
        polled = self._polled()
        listed = polled.found.get((ref["kind"], ref.get("namespace", ""))) if polled else None
        obj = listed.get(ref["name"]) if listed is not None else self._read(ref)
        return obj if obj is not None and _portal_object(obj) else None

    def _pods(self, labels: Mapping[str, str], by: str) -> list[dict[str, Any]]:
        """The pods with these labels in the workload's namespace (``by``: the most telling of them), from this
        pass's LIST where it made one."""
        polled = self._polled()
        listed = polled.pods(self._state["namespace"], labels, by) if polled else None
        return self._list("Pod", self._state["namespace"], labels) if listed is None else listed

    def _create(self, manifest: ko.Manifest) -> dict[str, Any]:
        """Create the object; if it exists already, check it is ours and converge it (see the module docstring)."""
        kind, ref = manifest["kind"], _ref(manifest)
        model = manifest if kind in _CUSTOM else getattr(client, f"V1{kind}").from_dict(manifest)
        args = [ref["namespace"], model] if ref["namespace"] else [model]
        created = self._json_call(kind, "create", *args, ok=(409,))
        if created is not None:
            return dict(created)
        existing = self._read(ref)
        if existing is None:  # deleted between the two calls
            raise BackendError(f"{kind} {ref['name']} vanished while it was created; try again", permanent=False)
        labels = existing.get("metadata", {}).get("labels") or {}
        ours = manifest["metadata"]["labels"]
        if labels.get("app.kubernetes.io/managed-by") != ko.MANAGED_BY or (
            labels.get(ko.LABEL_WORKSPACE) != ours[ko.LABEL_WORKSPACE]
        ):
            raise BackendError(f"{kind} {ref['name']} exists and is not this workspace's", permanent=True)
        if existing.get("metadata", {}).get("deletionTimestamp"):
            raise BackendError(f"{kind} {ref['name']} is still being deleted; try again", permanent=False)
        if kind in ("Job", "RayJob", "Pod"):  # a Job's or a Pod's spec is immutable; KubeRay runs a RayJob once
            return existing
        patched = self._json_call(kind, "patch", *self._scope(ref), manifest, _content_type=MERGE_PATCH)
        return dict(patched)

    def _delete(self, ref: Mapping[str, str]) -> None:
        policy = "Foreground" if ref["kind"] in _FOREGROUND else "Background"
        # Deleting a namespace that is already terminating is a 409: it is on its way.
        ok = (404, 409) if ref["kind"] == "Namespace" else (404,)
        self._call(ref["kind"], "delete", *self._scope(ref), ok=ok, propagation_policy=policy)

    def _delete_all(self, refs: list[dict[str, str]]) -> None:
        """Delete the objects (last created first) and wait until the API server has none of them."""
        for ref in reversed(refs):
            self._delete(ref)
        if not self._wait(lambda: all(self._read(ref) is None for ref in refs), self.stop_timeout_s):
            left = [f"{r['kind']} {r['name']}" for r in refs if self._read(r) is not None]
            raise BackendError(
                f"still being deleted after {self.stop_timeout_s:g}s: {', '.join(left)}", permanent=False
            )

    def _wait(self, done: Callable[[], bool], timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while True:
            if done():
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(self.poll_interval_s)

    # -- state ---------------------------------------------------------------------------------

    def get_state(self) -> dict[str, Any]:
        """Return the kind, key, namespace, the objects to delete on stop, and (once ended) the final status."""
        copied: dict[str, Any] = json.loads(json.dumps(self._state))
        return copied

    def load_state(self, state: dict[str, Any]) -> None:
        """Reattach to a workload's objects by their names."""
        if state and (
            state.get("version") != STATE_VERSION
            or state.get("kind") not in ("job", "notebook", "instance", "ray", "inference")
            or not isinstance(state.get("namespace"), str)
        ):
            raise BackendError(
                f"unreadable kubernetes backend state (version {state.get('version')!r})", permanent=True
            )
        self._state = json.loads(json.dumps(state))

    def clear_state(self) -> None:
        """Forget the workload; a finished Job stays until its ``ttlSecondsAfterFinished``, a finished RayJob as long
        (``sweep_orphans()``)."""
        self._state = {}

    # -- start ---------------------------------------------------------------------------------

    def start(self, spec: Spec) -> Endpoint:
        """Create the workload's objects and return once it runs.

        An instance runs once its objects exist (a vcluster then installs in the background: see
        ``poll()``); a notebook once its pod is ready; a job once every pod of the gang is ready (or
        has already ended); an inference replica once its pod is ready (``start_inference()``). Past
        ``start_timeout_s`` (an inference replica: its spec's) its objects are deleted and the start fails,
        transient. Calling it again for the same workload converges the objects and returns the same endpoint.
        Instance kinds other than ``namespace`` and ``vcluster`` are a permanent error.
        """
        if self._state and (self._state.get("key") != spec.key or self._state.get("final")):
            raise BackendError("this backend already ran a workload; clear_state() first", permanent=True)
        try:
            return super().start(spec)
        except ko.UnsupportedRequest as exc:
            raise PolicyRefusal(str(exc)) from exc

    def _begin(self, spec: Spec, kind: str, namespace: str, manifests: list[ko.Manifest], **extra: Any) -> None:
        """Record what is about to be created, so that a stop after a failed start finds all of it."""
        if not self._state:
            self._state = {
                "version": STATE_VERSION,
                "kind": kind,
                "key": spec.key,
                "workspace": spec.workspace,
                "name": spec.name,
                "namespace": namespace,
                "objects": [_ref(m) for m in manifests],
                **extra,
            }

    def _public_server(self) -> str:
        return self.server_url or str(self._api_client().configuration.host)

    def start_instance(self, spec: InstanceSpec) -> Endpoint:
        """A namespace or a vcluster (see ``start()``)."""
        owner = ko.Owner(workspace=spec.workspace, instance=spec.name)
        profile = ko.Size(spec.cpu_cores, spec.memory_gb, Decimal(str(spec.gpus)), spec.gpu_type)
        namespace = ko.namespace_name(owner, self.settings)
        if spec.kind == "namespace":
            manifests = ko.namespace_objects(owner, profile, spec.users, self.settings)
            server = self._public_server()
        elif spec.kind == "vcluster":
            release = kv.vcluster_release_name(owner)
            server = self.vcluster_server_url.format(release=release, namespace=namespace)
            manifests = kv.vcluster_objects(owner, profile, self.settings, api_server_url=server)
        else:
            raise BackendError(
                f"an instance of kind {spec.kind!r} cannot run on Kubernetes (namespace and vcluster can)",
                permanent=True,
            )
        # The Namespace alone is deleted on stop: everything in it goes with it.
        self._begin(spec, "instance", namespace, manifests[:1], instance_kind=spec.kind, gpus=str(spec.gpus))
        self._state.update(instance=spec.name, gpu_type=spec.gpu_type, server=server)
        for manifest in manifests:
            self._create(manifest)
        parts = urlsplit(server)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        self._state["endpoint"] = {"host": parts.hostname or "", "port": port, "url": server}
        return self._endpoint()

    def start_notebook(self, spec: NotebookSpec) -> Endpoint:
        """A StatefulSet in its instance's namespace (see ``start()``)."""
        instance = spec.instance_state
        namespace = instance.get("namespace")
        if not isinstance(namespace, str) or not namespace:
            raise BackendError("the notebook's instance has no Kubernetes namespace in its state", permanent=True)
        owner = ko.Owner(workspace=spec.workspace, instance=str(instance.get("instance", "")), namespace=namespace)
        # The notebook gets its instance's GPUs, counted as the instance holds them (a share, or whole ones).
        gpus = Decimal(str(instance.get("gpus") or len(spec.devices))) if spec.devices else Decimal(0)
        size = ko.Size(spec.cpu_cores, spec.memory_gb, gpus, str(instance.get("gpu_type", "")))
        manifests = ko.notebook_objects(
            owner,
            spec.name,
            image=spec.image or self.default_notebook_image,
            size=size,
            token=spec.token,
            settings=self.settings,
            base_url=spec.base_url or None,
            service_account=self._notebook_service_account(spec),
            portal_env=spec.portal_env,
        )
        manifests = _on_reservation(spec, manifests)
        self._begin(spec, "notebook", namespace, manifests, stateful_set=ko.notebook_name(spec.name))
        for manifest in manifests:
            self._create(manifest)
        service = f"{ko.notebook_name(spec.name)}.{namespace}.svc"
        url = ko.notebook_url(owner, spec.name, self.settings, spec.base_url or None)
        self._state["endpoint"] = {"host": service, "port": ko.JUPYTER_PORT, "url": url}
        self._wait_started(self._notebook_ready, "the notebook's server")
        return self._endpoint()

    @staticmethod
    def _notebook_service_account(spec: NotebookSpec) -> str | None:
        """No token unless the notebook asks. Then, in a namespace instance, the namespace's own account (the
        rights its users' kubeconfig has); in a vcluster's host namespace, where users hold no rights, the
        namespace's default account."""
        if not spec.service_account_token:
            return None
        if spec.instance_state.get("instance_kind") == "namespace":
            return ko.service_account_name()
        return "default"

    def _notebook_ready(self) -> bool:
        stateful_set = self._read(self._object("StatefulSet"))
        return stateful_set is not None and int(stateful_set.get("status", {}).get("readyReplicas") or 0) >= 1

    def start_ray_cluster(self, spec: RayClusterSpec) -> Endpoint:
        """A KubeRay RayCluster, or a RayJob for an entrypoint, in the workspace's Ray namespace (see
        ``kuberay_objects``); returns once KubeRay reports the cluster ``ready`` with every worker (a RayJob: or
        its job already running or over), with ``url`` the head's dashboard and Jobs API,
        ``http://ray-<name>-head-svc.<namespace>.svc:8265``. A RayJob of an earlier run under the name, already
        over, is deleted first (the start is retried)."""
        if not spec.auth_token:
            raise BackendError("a Ray cluster needs its auth token", permanent=True)
        owner = kro.ray_owner(spec.workspace, self.settings)
        ray = self._ray_spec(spec)
        namespace_manifests = kro.ray_namespace_objects(spec.workspace, self.settings)
        manifests = _on_reservation(spec, kro.ray_objects(owner, ray, self.settings))
        # The Ray namespace is the workspace's, shared by its clusters: it is not deleted with this one.
        self._begin(spec, "ray", ko.namespace_name(owner, self.settings), manifests, ray_kind=ray.kind)
        self._state.update(ray=ray.name, workers=ray.workers)
        for manifest in namespace_manifests:
            self._create(manifest)
        for manifest in manifests:
            existing = self._create(manifest)
            if manifest["kind"] == "RayJob" and not self._state.get("created") and kro.job_ended(existing):
                # A RayJob of an earlier attempt under this name: it goes, and the start is retried.
                self._delete(self._object("RayJob"))
                raise BackendError(
                    f"RayJob {manifest['metadata']['name']} of an earlier run is being deleted; try again",
                    permanent=False,
                )
        self._state["created"] = True
        namespace = self._state["namespace"]
        url = kro.dashboard_url(ray.name, namespace)
        self._state["endpoint"] = {"host": urlsplit(url).hostname, "port": kro.DASHBOARD_PORT, "url": url}
        self._wait_started(self._ray_started, "the Ray cluster")
        return self._endpoint()

    def _ray_spec(self, spec: RayClusterSpec) -> kro.RaySpec:
        def size(group: NodeGroup) -> ko.Size:
            return ko.Size(group.cpu_cores, group.memory_gb, Decimal(str(group.gpus)), group.gpu_type)

        return kro.RaySpec(
            name=_workload_name(spec.key),
            image=spec.image or self.default_ray_image,
            head=size(spec.head),
            worker=size(spec.workers),
            workers=spec.workers.replicas,
            auth_token=spec.auth_token,
            entrypoint=spec.entrypoint,
            env=spec.env,
            portal_env=spec.portal_env,
            max_runtime_s=math.ceil(spec.max_runtime_s) if spec.max_runtime_s else None,
            operator_namespace=self.kuberay_operator_namespace,
        )

    def _ray_started(self) -> bool:
        kind = self._state["ray_kind"]
        obj = self._read(self._object(kind))
        if obj is None:
            return True  # poll() tells what became of it
        if kind == "RayJob":
            return kro.job_started(obj, int(self._state["workers"]))
        return kro.cluster_ready(obj.get("status"), int(self._state["workers"]))

    def start_inference(self, spec: InferenceSpec) -> Endpoint:
        """One replica of an inference endpoint, in the workspace's serving namespace (see ``kubernetes_inference``):
        its key's Secret, its server's Pod, and its endpoint's headless Service (created with the first replica).
        Returns once the pod is ready (its readiness probe had the server's health path answer the key), with ``url``
        the pod's address: the portal's proxy balances between replicas itself. A server that exits first is a
        permanent ``BackendError``, one not ready within ``spec.start_timeout_s`` a transient one, both with its last
        log lines and the replica's objects deleted. A pod of an earlier run under the name, already ended, is
        deleted first (the start is retried)."""
        problem = self._inference_problem(spec)
        if problem:
            raise BackendError(problem, permanent=True)
        owner = ki.serve_owner(spec.workspace, self.settings)
        serve = ki.ServeSpec(
            name=_workload_name(spec.key),
            endpoint=spec.endpoint,
            server=spec.server,
            image=spec.image,
            model=os.path.relpath(spec.model_path, spec.work_dir),
            served_name=spec.served_name,
            size=ko.Size(spec.cpu_cores, spec.memory_gb, Decimal(str(spec.gpus)), spec.gpu_type),
            api_key=spec.api_key,
            extra_args=tuple(spec.extra_args),
        )
        namespace_manifests = ki.serve_namespace_objects(spec.workspace, self.settings)
        manifests = _on_reservation(spec, ki.replica_objects(owner, serve, self.settings))
        service = ki.endpoint_service(owner, spec.endpoint, self.settings)
        # The namespace is the workspace's and the Service the endpoint's: neither is deleted with one replica.
        namespace = ko.namespace_name(owner, self.settings)
        self._begin(spec, "inference", namespace, manifests, pod=ki.replica_name(serve.name))
        self._state.update(serves=spec.endpoint, service=_ref(service))
        for manifest in namespace_manifests:
            self._create(manifest)
        for manifest in manifests:
            existing = self._create(manifest)
            if manifest["kind"] == "Pod" and not self._state.get("created") and ki.pod_exit(existing) is not None:
                self._delete(self._object("Pod"))
                earlier = f"Pod {self._state['pod']} of an earlier run is being deleted; try again"
                raise BackendError(earlier, permanent=False)
        self._state["created"] = True
        self._create(service)
        pod = self._replica_ready(spec.start_timeout_s)
        # Again: the last replica of the endpoint, stopping meanwhile, may have deleted it.
        self._create(service)
        ip = str(pod["status"]["podIP"])
        self._state["endpoint"] = {"host": ip, "port": ki.SERVER_PORT, "url": ki.target_url(pod)}
        return self._endpoint()

    @staticmethod
    def _inference_problem(spec: InferenceSpec) -> str:
        """Why ``spec`` cannot run here ("" if it can): what the portal must always give."""
        if not spec.image:
            return "the inference profile names no container image, which Kubernetes needs"
        if not spec.api_key:
            return "an inference replica needs its API key"
        if not re.match(r"^[a-z0-9]([-a-z0-9]{0,40}[a-z0-9])?$", spec.endpoint):
            return f"the endpoint's id {spec.endpoint!r} is not a short DNS label"
        try:
            ki.check_model_path(os.path.relpath(spec.model_path, spec.work_dir))
        except ValueError as exc:
            return str(exc)
        return ""

    def _replica_ready(self, timeout_s: float) -> dict[str, Any]:
        """The replica's pod once it is ready; its objects deleted and ``BackendError`` if it ends or is not ready in
        time (permanent where the server exited: it would again)."""
        deadline = time.monotonic() + timeout_s
        while True:
            pod = self._read(self._object("Pod"))
            code = ki.pod_exit(pod) if pod is not None else None
            if pod is not None and code is None and ki.pod_ready(pod):
                return pod
            if pod is None:
                problem, permanent = "the replica's pod was deleted before its server answered", False
            elif code is not None:
                problem, permanent = f"the server exited with code {code} before it answered: {self._log_tail()}", True
            elif time.monotonic() >= deadline:
                waiting = ki.pod_waiting(pod)
                problem = f"the server did not answer within {timeout_s:g}s{f' ({waiting})' if waiting else ''}"
                problem, permanent = f"{problem}: {self._log_tail()}", False
            else:
                time.sleep(self.poll_interval_s)
                continue
            self._end_replica(wait=True)
            self._state["final"] = {"exit_code": code if code is not None else UNKNOWN_EXIT_CODE, "message": problem}
            raise BackendError(problem, permanent=permanent)

    def _log_tail(self, lines: int = 8) -> str:
        """The last lines of the replica's server log, on one line ("no log" where there is none)."""
        data = self._invoke(
            client.CoreV1Api,
            "read_namespaced_pod_log",
            self._state["pod"],
            self._state["namespace"],
            container=ki.SERVER_CONTAINER,
            tail_lines=lines,
            ok=(400, 404),
        )
        text = (data or b"").decode("utf-8", "replace").strip()
        return " | ".join(line for line in text.splitlines() if line.strip()) or "no log"

    def _end_replica(self, *, wait: bool) -> None:
        """Delete the replica's Pod and Secret (``wait``: until they are gone), then its endpoint's Service where no
        other replica of the endpoint is left: none starting or running, that is, not ended nor being deleted."""
        if wait:
            self._delete_all(self._state["objects"])
        else:
            for ref in reversed(self._state["objects"]):
                self._delete(ref)
        owner = ki.serve_owner(self._state["workspace"], self.settings)
        pods = self._list("Pod", self._state["namespace"], ki.endpoint_selector(owner, self._state["serves"]))
        others = [
            pod
            for pod in pods
            if pod["metadata"].get("name") != self._state["pod"]
            and not pod["metadata"].get("deletionTimestamp")
            and ki.pod_exit(pod) is None
        ]
        if not others:
            self._delete(self._state["service"])

    def submit(self, spec: JobSpec) -> None:
        """Create a job's objects with its Job suspended: no pod exists until ``start()`` releases it.

        Optional: ``start()`` submits first if this was not called. Idempotent.
        """
        validate_spec(spec)
        if self._state and (self._state.get("key") != spec.key or self._state.get("final")):
            raise BackendError("this backend already ran a workload; clear_state() first", permanent=True)
        owner = ko.jobs_owner(spec.workspace, self.settings)
        gpus = len(spec.devices[0]) if spec.devices else 0
        gang = ko.GangJob(
            name=_workload_name(spec.key),
            image=spec.image or self.default_job_image,
            command=spec.command,
            size=ko.Size(spec.cpu_cores, spec.memory_gb, Decimal(gpus)),
            replicas=spec.replicas,
            env={**spec.env, "PORTAL_JOB_KEY": spec.key},
            max_runtime_s=math.ceil(spec.max_runtime_s) if spec.max_runtime_s else None,
            # The jobs namespace has no account of the portal's: a job that asks gets its namespace's default one.
            service_account="default" if spec.service_account_token else None,
            portal_env=spec.portal_env,
        )
        try:
            namespace_manifests = ko.jobs_namespace_objects(spec.workspace, self.settings)
            manifests = _on_reservation(spec, ko.job_objects(owner, gang, self.settings))
        except ko.UnsupportedRequest as exc:
            raise PolicyRefusal(str(exc)) from exc
        job = ko.job_name(gang.name)
        # The jobs namespace is the workspace's, shared by its jobs: it is not deleted with this one.
        self._begin(spec, "job", ko.namespace_name(owner, self.settings), manifests, job=job, replicas=spec.replicas)
        for manifest in namespace_manifests:
            self._create(manifest)
        for manifest in manifests:
            existing = self._create(manifest)
            if manifest["kind"] == "Job" and not self._state.get("released") and self._ended(existing):
                # A Job of an earlier attempt under this name: it goes, and the start is retried.
                self._delete(self._object("Job"))
                raise BackendError(f"Job {job} of an earlier run is being deleted; try again", permanent=False)
        namespace = self._state["namespace"]
        master = f"{ko.master_address(gang.name)}.{namespace}.svc"
        self._state["endpoint"] = {"host": master, "port": self.settings.master_port, "url": ""}

    def start_job(self, spec: JobSpec) -> Endpoint:
        """A suspended indexed Job, released once created (see ``start()`` and ``submit()``)."""
        self.submit(spec)
        self._json_call(
            "Job",
            "patch",
            self._state["job"],
            self._state["namespace"],
            ko.job_release_patch(),
            _content_type=MERGE_PATCH,
        )
        self._state["released"] = True
        self._wait_started(self._gang_started, "every pod of the gang")
        return self._endpoint()

    def _gang_started(self) -> bool:
        job = self._read(self._object("Job"))
        if job is None or self._ended(job):
            return True  # poll() tells what became of it
        status = job.get("status", {})
        started = sum(int(status.get(k) or 0) for k in ("ready", "succeeded", "failed"))
        return started >= int(self._state["replicas"])

    def _wait_started(self, started: Callable[[], bool], what: str) -> None:
        if self._wait(started, self.start_timeout_s):
            return
        self._delete_all(self._state["objects"])
        self._state["final"] = {"exit_code": UNKNOWN_EXIT_CODE, "message": "did not start in time"}
        raise BackendError(f"{what} was not ready within {self.start_timeout_s:g}s; it was deleted", permanent=False)

    def _object(self, kind: str) -> dict[str, str]:
        return next(dict(ref) for ref in self._state["objects"] if ref["kind"] == kind)

    def _endpoint(self) -> Endpoint:
        endpoint = self._state["endpoint"]
        return Endpoint(host=endpoint["host"], port=int(endpoint["port"]), url=endpoint["url"])

    # -- poll / stop ---------------------------------------------------------------------------

    def poll(self) -> Status:
        """Running, or exited: from the Job's conditions, the StatefulSet's or the Namespace's existence.

        A job: ``Complete`` → 0; ``Failed`` → the first non-zero exit code of its pods (by when they ended),
        ``TIMEOUT_EXIT_CODE`` for ``DeadlineExceeded``; a Job gone before it was seen ending →
        ``UNKNOWN_EXIT_CODE``. Once ended, the job's headless Service is deleted (its Job stays, with the
        logs, until its TTL). A notebook or an instance runs while its StatefulSet or Namespace exists (and
        a vcluster's installer has not failed). A Ray cluster runs while its RayCluster exists; a RayJob ends
        as ``kuberay_objects.job_outcome`` says, and then its Secret and policies are deleted (the RayJob stays,
        with its submitter's log, as long as a Job: see ``sweep_orphans()``). An inference replica runs while its pod
        runs; once its server exited (the pod's code, with its last log lines) its Pod and Secret are deleted, and
        its endpoint's Service with the last replica. An object under the workload's name
        that does not carry the portal's label is not the workload's. Within ``polling()``, from its LISTs.
        """
        if not self._state:
            raise BackendError("nothing was started on this backend", permanent=True)
        final = self._state.get("final")
        if final:
            return Status("exited", final["exit_code"], final["message"])
        kind = self._state["kind"]
        pollers = {
            "job": self._poll_job,
            "notebook": self._poll_notebook,
            "instance": self._poll_instance,
            "ray": self._poll_ray,
            "inference": self._poll_inference,
        }
        status = pollers[kind]()
        if not status.running:
            if kind == "job":
                self._delete(self._object("Service"))
            if kind == "ray":
                # What the cluster's pods needed; the RayJob stays a while, with its submitter's log (the output).
                for ref in self._state["objects"]:
                    if ref["kind"] in ("Secret", "NetworkPolicy"):
                        self._delete(ref)
            if kind == "inference":
                self._end_replica(wait=False)
            self._state["final"] = {"exit_code": status.exit_code, "message": status.message, "ended_at": time.time()}
        return status

    @contextlib.contextmanager
    def polling(self, states: Iterable[dict[str, Any]]) -> Iterator[None]:
        """Within it, ``poll()`` and ``progress()`` of any backend of this API server (the same ``host``, or
        ``kubeconfig`` and ``context``) read the workloads of ``states`` (``get_state()`` blobs) from LISTs made on
        entry, one per kind and namespace they are read from: the Jobs and pods of each jobs namespace, the
        StatefulSets of each instance's, the RayClusters or RayJobs (and pods) of each Ray namespace, the
        Namespaces (and a vcluster's installer Job), each LIST selecting the portal's objects by their label. A
        workload whose object a LIST lacks is gone, as a 404 says when it is read alone; ``progress()`` finds its pod
        in the LIST, then reads its log. A LIST that fails is logged, and what would have been read from it is
        read alone. What it says is as old as the pass."""
        outer = self._polled()
        found = dict(outer.found) if outer else {}
        for kind, namespace in sorted({pair for state in states for pair in _lists_for(state)}):
            try:
                found[(kind, namespace)] = self._list_all(kind, namespace)
            except BackendError as exc:
                where = namespace or "the cluster"
                logger.warning("listing the %ss of %s failed; each is read alone: %s", kind, where, exc.message)
        token = _POLLED.set({**(_POLLED.get() or {}), self._server: _Listed(found)})
        try:
            yield
        finally:
            _POLLED.reset(token)

    @staticmethod
    def _ended(job: Mapping[str, Any]) -> bool:
        return _condition(job, "Complete") is not None or _condition(job, "Failed") is not None

    def _poll_job(self) -> Status:
        job = self._current(self._object("Job"))
        if job is None:
            return Status("exited", UNKNOWN_EXIT_CODE, "the Job was deleted before its end was seen")
        if _condition(job, "Complete"):
            return Status("exited", 0, "exited")
        failed = _condition(job, "Failed")
        if failed is None:
            return Status("running")
        if failed.get("reason") == "DeadlineExceeded":
            return Status("exited", TIMEOUT_EXIT_CODE, "killed by Kubernetes after exceeding its time limit")
        exits = self._pod_exits()
        if exits:
            rank, code = exits[0]
            return Status("exited", code, f"replica {rank} exited with code {code}")
        detail = failed.get("message") or failed.get("reason") or "failed"
        return Status("exited", UNKNOWN_EXIT_CODE, f"the Job failed: {detail}")

    def _pod_exits(self) -> list[tuple[int, int]]:
        """(rank, exit code) of each pod whose main container ended non-zero, earliest end first."""
        ended: list[tuple[str, int, int]] = []
        for pod in self._job_pods():
            for container in pod.get("status", {}).get("containerStatuses") or []:
                terminated = (container.get("state") or {}).get("terminated") or {}
                if container.get("name") == "main" and terminated.get("exitCode"):
                    rank = int(_pod_index(pod))
                    ended.append((str(terminated.get("finishedAt") or ""), rank, int(terminated["exitCode"])))
        return [(rank, code) for _, rank, code in sorted(ended)]

    def _job_pods(self, index: int | None = None) -> list[dict[str, Any]]:
        pods = self._pods({JOB_NAME_LABEL: self._state["job"]}, by=JOB_NAME_LABEL)
        if index is not None:
            pods = [p for p in pods if _pod_index(p) == str(index)]
        return sorted(pods, key=lambda p: str(p.get("metadata", {}).get("creationTimestamp") or ""))

    def _poll_notebook(self) -> Status:
        stateful_set = self._current(self._object("StatefulSet"))
        if stateful_set is None:
            return Status("exited", UNKNOWN_EXIT_CODE, "the notebook's StatefulSet was deleted outside the portal")
        ready = int(stateful_set.get("status", {}).get("readyReplicas") or 0)
        return Status("running", message="ready" if ready else "not ready")

    def _poll_ray(self) -> Status:
        kind = self._state["ray_kind"]
        obj = self._current(self._object(kind))
        if obj is None:
            return Status("exited", UNKNOWN_EXIT_CODE, f"the {kind} was deleted before its end was seen")
        if kind == "RayJob":
            outcome = kro.job_outcome(obj)
            if outcome is not None:
                return Status("exited", outcome[0], outcome[1])
            cluster = (obj.get("status") or {}).get("rayClusterStatus")
        else:
            cluster = obj.get("status") or {}
            if cluster.get("state") == "failed":  # deprecated: older operators set it, v1.7.0 no longer does
                return Status("exited", UNKNOWN_EXIT_CODE, f"the RayCluster failed: {cluster.get('reason') or ''}")
        ready = kro.cluster_ready(cluster, int(self._state["workers"]))
        return Status("running", message="ready" if ready else "not ready")

    def _poll_inference(self) -> Status:
        pod = self._current(self._object("Pod"))
        if pod is None:
            return Status("exited", UNKNOWN_EXIT_CODE, "the replica's pod was deleted outside the portal")
        code = ki.pod_exit(pod)
        if code is None:
            return Status("running", message="ready" if ki.pod_ready(pod) else "not ready")
        return Status("exited", code, f"the server exited with code {code}: {self._log_tail()}")

    def _poll_instance(self) -> Status:
        namespace = self._current(self._object("Namespace"))
        if namespace is None or namespace.get("status", {}).get("phase") == "Terminating":
            return Status("exited", UNKNOWN_EXIT_CODE, "the namespace was deleted outside the portal")
        if self._state.get("instance_kind") == "vcluster":
            ref = {"kind": "Job", "name": kv.VCLUSTER_INSTALLER, "namespace": self._state["namespace"]}
            installer = self._current(ref)
            failed = _condition(installer, "Failed") if installer else None
            if failed:
                return Status("exited", 1, f"the vcluster chart did not install: {failed.get('message') or ''}")
        return Status("running")

    def stop(self, grace_s: float = 10.0) -> None:
        """Delete the workload's objects (Jobs and StatefulSets in the foreground, so their pods go first) and
        wait until the API server has none of them; a 404 is success. An instance's Namespace takes everything
        in it along; an inference replica's endpoint Service goes with the endpoint's last replica. Pods end with
        their own ``terminationGracePeriodSeconds``: ``grace_s`` is not passed on. Raises ``BackendError``
        (transient) if something is still being deleted after ``stop_timeout_s``.
        """
        if not self._state or self._state.get("final"):
            return
        self._state["stopped"] = True
        if self._state["kind"] == "inference":
            self._end_replica(wait=True)
        else:
            self._delete_all(self._state["objects"])
        # A job, or a Ray cluster running its entrypoint, was cut short; an instance, notebook or Ray cluster ends so.
        cut_short = self._state["kind"] == "job" or self._state.get("ray_kind") == "RayJob"
        code = STOPPED_EXIT_CODE if cut_short else 0
        self._state["final"] = {"exit_code": code, "message": "stopped on request", "ended_at": time.time()}

    # -- logs, artifacts, progress, kubeconfig, inventory --------------------------------------

    def logs(self, replica: int = 0, offset: int = 0) -> tuple[bytes, int]:
        """Up to 1 MiB of a replica's pod log from ``offset`` (a job's pod of that completion index, the
        notebook's pod, an inference replica's server; a Ray cluster's replica 0 is its RayJob's submitter, whose log
        is the Ray job's output, or its head, replicas 1.. its workers); ``(b"", offset)`` while there is no pod or
        no log yet, or once the pod is gone. An instance has no log of its own."""
        kind = self._state.get("kind")
        replicas = {
            "job": int(self._state.get("replicas", 1)),
            "notebook": 1,
            "ray": 1 + int(self._state.get("workers", 0)),
            "inference": 1,
        }.get(str(kind), 0)
        if not 0 <= replica < replicas:
            raise BackendError(f"no replica {replica}", permanent=True)
        pod_container = self._pod(replica)
        if pod_container is None:
            return b"", offset
        pod, container = pod_container
        data = self._invoke(
            client.CoreV1Api,
            "read_namespaced_pod_log",
            pod,
            self._state["namespace"],
            container=container,
            limit_bytes=offset + LOG_CHUNK,
            ok=(400, 404),  # 400: the container has not started yet
        )
        chunk = (data or b"")[offset : offset + LOG_CHUNK]
        return chunk, offset + len(chunk)

    def _pod(self, replica: int) -> tuple[str, str] | None:
        if self._state["kind"] == "notebook":
            return f"{self._state['stateful_set']}-0", "notebook"
        if self._state["kind"] == "ray":
            return self._ray_pod(replica)
        if self._state["kind"] == "inference":
            return self._state["pod"], ki.SERVER_CONTAINER
        pods = self._job_pods(replica)
        return (str(pods[-1]["metadata"]["name"]), "main") if pods else None

    def _ray_pod(self, replica: int) -> tuple[str, str] | None:
        """(pod, container) of a Ray cluster's replica, found by the role label of its pod template."""
        if replica == 0 and self._state.get("ray_kind") == "RayJob":
            role, container = "submitter", kro.SUBMITTER_CONTAINER
        elif replica == 0:
            role, container = "head", kro.HEAD_CONTAINER
        else:
            role, container = "worker", kro.WORKER_CONTAINER
        owner = kro.ray_owner(self._state["workspace"], self.settings)
        pods = self._pods(kro.cluster_labels(owner, self._state["ray"], role), by=ko.LABEL_NAME)
        if role == "submitter":  # the latest attempt's
            pods.sort(key=lambda p: str(p.get("metadata", {}).get("creationTimestamp") or ""))
            pods = pods[-1:]
        else:
            pods.sort(key=lambda p: str(p.get("metadata", {}).get("name")))
            pods = pods[replica - 1 : replica] if role == "worker" else pods[:1]
        return (str(pods[0]["metadata"]["name"]), container) if pods else None

    def progress(self) -> Progress | None:
        """The last ``PROGRESS <fraction>`` in the last lines of replica 0's log, clamped to 0..1 (a job's, a
        Ray cluster's entrypoint's)."""
        if self._state.get("kind") != "job" and self._state.get("ray_kind") != "RayJob":
            return None
        pod_container = self._pod(0)
        if pod_container is None:
            return None
        pod, container = pod_container
        tail = self._invoke(
            client.CoreV1Api,
            "read_namespaced_pod_log",
            pod,
            self._state["namespace"],
            container=container,
            tail_lines=PROGRESS_TAIL_LINES,
            ok=(400, 404),
        )
        return last_progress(tail or b"")

    def kubeconfig(self) -> str | None:
        """A kubeconfig (YAML) for an instance's users: the namespace's service account token, or the
        vcluster's own. ``BackendError`` (transient) while the token or the vcluster is not there yet."""
        if self._state.get("kind") != "instance":
            return None
        namespace = self._state["namespace"]
        if self._state.get("instance_kind") == "vcluster":
            name = kv.vcluster_kubeconfig_secret_name(ko.Owner(self._state["workspace"], self._state["instance"]))
            data = self._secret_data(name, namespace, "config")
            return base64.b64decode(data["config"]).decode()
        data = self._secret_data(f"{ko.service_account_name()}-token", namespace, "token", "ca.crt")
        manifest = ko.kubeconfig(
            username=ko.service_account_name(),
            server=self._state["server"],
            ca_data=data["ca.crt"],
            token=base64.b64decode(data["token"]).decode(),
            namespace=namespace,
        )
        return yaml.safe_dump(manifest, sort_keys=False)

    def _secret_data(self, name: str, namespace: str, *keys: str) -> dict[str, str]:
        secret = self._read({"kind": "Secret", "name": name, "namespace": namespace})
        data = (secret or {}).get("data") or {}
        if not all(data.get(key) for key in keys):
            raise BackendError(f"the Secret {name} has no {' and '.join(keys)} yet", permanent=False)
        return {key: str(data[key]) for key in keys}

    def discover(self) -> list[GpuInfo]:
        """One ``GpuInfo`` per allocatable ``gpu_resource_name`` of each node (index ``<node>:<i>``), named by
        the node's ``nvidia.com/gpu.product`` label, with ``nvidia.com/gpu.memory`` (MiB) where labelled."""
        gpus: list[GpuInfo] = []
        for node in self._nodes():
            meta, status = node.get("metadata", {}), node.get("status", {})
            count = str((status.get("allocatable") or {}).get(self.settings.gpu_resource_name, "0"))
            labels = meta.get("labels") or {}
            memory = str(labels.get(GPU_MEMORY_LABEL, ""))
            product = str(labels.get(GPU_PRODUCT_LABEL) or "gpu")
            total = int(count) if count.isdigit() else 0
            gpus += [
                GpuInfo(index=f"{meta['name']}:{i}", name=product, memory_mb=int(memory) if memory.isdigit() else 0)
                for i in range(total)
            ]
        return sorted(gpus, key=lambda g: (g.index.rsplit(":", 1)[0], int(g.index.rsplit(":", 1)[1])))

    def nodes(self) -> list[NodeInfo]:
        """Every node, with its allocatable CPUs (whole ones) and memory: ``down`` unless its ``Ready``
        condition is true, ``drained`` while it is cordoned (``spec.unschedulable``)."""
        found = []
        for node in self._nodes():
            allocatable = node.get("status", {}).get("allocatable") or {}
            ready = _condition(node, "Ready") is not None
            cordoned = bool((node.get("spec") or {}).get("unschedulable"))
            found.append(
                NodeInfo(
                    name=str(node["metadata"]["name"]),
                    cpu_cores=int(_quantity(allocatable.get("cpu"))),
                    memory_mb=int(_quantity(allocatable.get("memory")) / (1 << 20)),
                    state="down" if not ready else "drained" if cordoned else "ready",
                )
            )
        return sorted(found, key=lambda n: n.name)

    def sweep_orphans(self, owner: str, keep: Keep | None = None) -> list[str]:
        """Delete the portal's RayJobs that ended ``job_ttl_after_finished_s`` ago or more (KubeRay's
        ``status.endTime``), as Kubernetes deletes a finished Job after its ``ttlSecondsAfterFinished``: KubeRay
        keeps a finished RayJob, with its submitter's Job and pod, for good. A RayJob that a kept state records,
        or that is named after a kept key, stays. Nothing else is swept: every object is named after its
        workload's key, and a repeated start converges on what a lost one left (``owner`` plays no part).
        One LIST of the portal's RayJobs in every namespace; none where KubeRay is not installed.
        Returns ``<namespace>/<name>`` of each RayJob deleted."""
        keep = keep or Keep()
        kept = {(s.get("namespace"), ref["name"]) for s in keep.states if s for ref in s.get("objects") or []}
        kept_names = {kro.cluster_name(_workload_name(key)) for key in keep.keys}
        group, version, plural = _CUSTOM["RayJob"]
        listed = self._invoke(
            client.CustomObjectsApi, "list_cluster_custom_object", group, version, plural,
            label_selector=_PORTAL_SELECTOR, ok=(404,),
        )  # fmt: skip
        deleted = []
        for ray_job in json.loads(listed or b"{}").get("items") or []:
            meta = ray_job.get("metadata") or {}
            ref = {"kind": "RayJob", "name": str(meta.get("name", "")), "namespace": str(meta.get("namespace", ""))}
            if (ref["namespace"], ref["name"]) in kept or ref["name"] in kept_names or not self._expired(ray_job):
                continue
            self._delete(ref)
            deleted.append(f"{ref['namespace']}/{ref['name']}")
        return deleted

    def _expired(self, ray_job: Mapping[str, Any]) -> bool:
        """A RayJob of the portal's, in a workspace's Ray namespace, that ended long enough ago to be deleted."""
        meta = ray_job.get("metadata") or {}
        workspace = str((meta.get("labels") or {}).get(ko.LABEL_WORKSPACE, ""))
        if not _portal_object(ray_job) or meta.get("namespace") != kro.ray_namespace_name(workspace, self.settings):
            return False
        ended_at = kro.job_ended_at(ray_job)
        return ended_at is not None and time.time() - ended_at >= self.settings.job_ttl_after_finished_s

    def _nodes(self) -> list[dict[str, Any]]:
        answer = json.loads(self._invoke(client.CoreV1Api, "list_node") or b"{}")
        return [dict(node) for node in answer.get("items") or []]


def _on_reservation(spec: Spec, manifests: list[ko.Manifest]) -> list[ko.Manifest]:
    """The workload's manifests with its pods placed on the nodes of the GPU reservation its spec names
    (``kubernetes_reservations.on_reservation``: the reservation's nodeSelector and toleration); as they are
    where it names none. A name that cannot be a label's value is a permanent ``BackendError``."""
    reservation = str(getattr(spec, "reservation", "") or "")
    return [kr.on_reservation(manifest, reservation) for manifest in manifests] if reservation else manifests


def _quantity(value: Any) -> Decimal:
    """A Kubernetes quantity (``7800m``, ``64Gi``) as a number; 0 where there is none or it is unreadable."""
    try:
        return _parse_quantity(value) if value is not None else Decimal(0)
    except ValueError:
        return Decimal(0)


def _pod_index(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata", {})
    labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
    return str(labels.get(JOB_INDEX_LABEL, annotations.get(ko.JOB_INDEX_ANNOTATION, "")))
