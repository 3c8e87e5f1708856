"""The fields KubeRay documents for ``ray.io/v1`` RayCluster and RayJob at the pinned release, and a checker.

No package ships KubeRay's CRDs, and copying the CRD into this repository is not allowed, so this module holds,
written by hand for KubeRay ``DOCUMENTED_VERSION`` (v1.7.0), the documented field tree of the
objects the portal writes: for each object, the keys allowed there, their types (string, boolean, int32, number,
a string map, an object, a list, a Kubernetes pod template or Service), the enumerations and minimums that are
documented, and which fields are required. Sources, all at the tag v1.7.0:

- the API reference, https://github.com/ray-project/kuberay/blob/v1.7.0/docs/reference/api.md (names, types,
  enumerations, defaults, minimums);
- the Go types it is generated from, https://github.com/ray-project/kuberay/blob/v1.7.0/ray-operator/apis/ray/v1/
  ``raycluster_types.go`` and ``rayjob_types.go``: a field is required where its JSON tag has no ``omitempty``
  and it is not marked ``+optional`` (the reference does not say);
- the operator's own checks, https://github.com/ray-project/kuberay/blob/v1.7.0/ray-operator/controllers/ray/
  utils/validation.go (``operator_problems`` below holds those the portal's manifests could break).

Objects the portal does not write (autoscaler options, GCS fault tolerance, deletion strategies...) are listed
with their documented name and checked to be objects, nothing more (``OPAQUE``). Pod templates and the head
Service are Kubernetes types: they are checked with ``kubernetes-validate`` against the Kubernetes 1.37 schemas,
strict (unknown fields fail), as every other manifest of the portal's is.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import kubernetes_validate

from workers.backends import kuberay_objects as kro

#: The KubeRay release this field list was written from: a test fails when kuberay_objects pins another.
DOCUMENTED_VERSION = "v1.7.0"
K8S_VERSION = "1.37.0"
INT32 = (-(2**31), 2**31 - 1)
DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
# KubeRay's MaxRayClusterNameLength and MaxRayJobNameLength (utils/constant.go).
MAX_NAME = {"RayCluster": 53, "RayJob": 47}
MIN_RAY_VERSION_FOR_TOKEN_AUTH = (2, 52, 0)


class T(enum.Enum):
    """A documented type."""

    STRING = "string"
    BOOLEAN = "boolean"
    INT32 = "integer"
    NUMBER = "float"
    STRING_MAP = "object (keys:string, values:string)"
    OBJECT = "object"
    ARRAY = "array"
    OBJECT_META = "ObjectMeta"  # Kubernetes types, checked against the Kubernetes schemas
    POD_TEMPLATE = "PodTemplateSpec"
    SERVICE = "Service"
    OPAQUE = "an object the portal does not write"


@dataclass(frozen=True)
class F:
    """One documented field: its type, whether it is required, its enumeration or minimum; an object's fields, a
    list's item."""

    type: T
    required: bool = False
    enum: tuple[str, ...] = ()
    minimum: int | None = None
    fields: Mapping[str, F] = field(default_factory=dict)
    item: F | None = None


def obj(fields: Mapping[str, F], *, required: bool = False) -> F:
    return F(T.OBJECT, required=required, fields=fields)


STRING = F(T.STRING)
BOOLEAN = F(T.BOOLEAN)
INT = F(T.INT32)
NUMBER = F(T.NUMBER)
STRING_MAP = F(T.STRING_MAP)
OPAQUE = F(T.OPAQUE)
MANAGED_BY = F(T.STRING, enum=("ray.io/kuberay-operator", "kueue.x-k8s.io/multikueue"))

# AuthOptions (api.md "AuthOptions", raycluster_types.go AuthOptions)
AUTH_OPTIONS = obj(
    {"enableK8sTokenAuth": BOOLEAN, "secretName": STRING, "mode": F(T.STRING, enum=("disabled", "token"))}
)

# HeadGroupSpec: template is required (no omitempty, no +optional)
HEAD_GROUP_SPEC = obj(
    {
        "template": F(T.POD_TEMPLATE, required=True),
        "headService": F(T.SERVICE),
        "enableIngress": BOOLEAN,
        "ingressOptions": OPAQUE,
        "resources": STRING_MAP,
        "labels": STRING_MAP,
        "rayStartParams": STRING_MAP,
        "serviceType": F(T.STRING, enum=("ClusterIP", "NodePort", "LoadBalancer", "ExternalName")),
    },
    required=True,
)

# WorkerGroupSpec: groupName, minReplicas, maxReplicas and template are required
WORKER_GROUP_SPEC = obj(
    {
        "suspend": BOOLEAN,
        "groupName": F(T.STRING, required=True),
        "replicas": INT,
        "minReplicas": F(T.INT32, required=True),
        "maxReplicas": F(T.INT32, required=True),
        "idleTimeoutSeconds": INT,
        "priority": INT,
        "resources": STRING_MAP,
        "labels": STRING_MAP,
        "rayStartParams": STRING_MAP,
        "template": F(T.POD_TEMPLATE, required=True),
        "scaleStrategy": obj({"workersToDelete": F(T.ARRAY, item=STRING)}),
        "numOfHosts": INT,
    }
)

# RayClusterSpec: headGroupSpec is required
RAY_CLUSTER_SPEC = obj(
    {
        "upgradeStrategy": obj({"type": F(T.STRING, enum=("Recreate", "None"))}),
        "authOptions": AUTH_OPTIONS,
        "suspend": BOOLEAN,
        "managedBy": MANAGED_BY,
        "autoscalerOptions": OPAQUE,
        "headServiceAnnotations": STRING_MAP,
        "enableInTreeAutoscaling": BOOLEAN,
        "gcsFaultToleranceOptions": OPAQUE,
        "historyServerOptions": OPAQUE,
        "networkPolicy": OPAQUE,
        "tlsOptions": obj({"enabled": BOOLEAN}),
        "headGroupSpec": HEAD_GROUP_SPEC,
        "rayVersion": STRING,
        "workerGroupSpecs": F(T.ARRAY, item=WORKER_GROUP_SPEC),
    }
)

# RayJobSpec: nothing required
RAY_JOB_SPEC = obj(
    {
        "activeDeadlineSeconds": INT,
        "backoffLimit": INT,
        "rayClusterSpec": RAY_CLUSTER_SPEC,
        "submitterPodTemplate": F(T.POD_TEMPLATE),
        "metadata": STRING_MAP,
        "clusterSelector": STRING_MAP,
        "submitterConfig": obj({"backoffLimit": INT}),
        "managedBy": MANAGED_BY,
        "deletionStrategy": OPAQUE,
        "entrypoint": STRING,
        "runtimeEnvYAML": STRING,
        "jobId": STRING,
        "submissionMode": F(T.STRING, enum=("K8sJobMode", "HTTPMode", "InteractiveMode", "SidecarMode")),
        "entrypointResources": STRING,
        "entrypointNumCpus": NUMBER,
        "entrypointNumGpus": NUMBER,
        "ttlSecondsAfterFinished": INT,
        "preRunningDeadlineSeconds": F(T.INT32, minimum=1),
        "shutdownAfterJobFinishes": BOOLEAN,
        "suspend": BOOLEAN,
    }
)


def _resource(kind: str, spec: F) -> F:
    return obj(
        {
            "apiVersion": F(T.STRING, required=True, enum=(f"{kro.RAY_API_GROUP}/{kro.RAY_API_VERSION}",)),
            "kind": F(T.STRING, required=True, enum=(kind,)),
            "metadata": F(T.OBJECT_META, required=True),
            "spec": spec,
        }
    )


RESOURCES = {"RayCluster": _resource("RayCluster", RAY_CLUSTER_SPEC), "RayJob": _resource("RayJob", RAY_JOB_SPEC)}


# -- the checker ----------------------------------------------------------------------------------------------


def problems(manifest: Mapping[str, Any]) -> list[str]:
    """Everything in ``manifest`` that the pinned KubeRay does not document: an unknown or misplaced key, a value
    of the wrong type or outside its enumeration, a missing required field, an invalid pod template. Empty: none."""
    schema = RESOURCES.get(str(manifest.get("kind")))
    if schema is None:
        return [f"kind: {manifest.get('kind')!r} is not RayCluster or RayJob"]
    return _check(schema, manifest, "")


def _check(schema: F, value: Any, path: str) -> list[str]:
    where = path or "(the object)"
    kind = schema.type
    if kind is T.OBJECT:
        return _check_object(schema, value, path)
    if kind is T.ARRAY:
        if not isinstance(value, list):
            return [f"{where}: a list was expected, not {type(value).__name__}"]
        assert schema.item is not None
        return [p for i, item in enumerate(value) for p in _check(schema.item, item, f"{path}[{i}]")]
    if kind in (T.OBJECT_META, T.POD_TEMPLATE, T.SERVICE):
        return _check_kubernetes(kind, value, where)
    if kind is T.OPAQUE:
        return [] if isinstance(value, dict) else [f"{where}: an object was expected"]
    if kind is T.STRING_MAP:
        ok = isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())
        return [] if ok else [f"{where}: a map of strings to strings was expected"]
    return _check_scalar(schema, value, where)


def _check_object(schema: F, value: Any, path: str) -> list[str]:
    where = path or "(the object)"
    if not isinstance(value, dict):
        return [f"{where}: an object was expected, not {type(value).__name__}"]
    found = [
        f"{path}.{key}".lstrip(".") + f": not a field KubeRay {DOCUMENTED_VERSION} documents here"
        for key in value
        if key not in schema.fields
    ]
    found += [
        f"{path}.{key}".lstrip(".") + ": required, missing"
        for key, spec in schema.fields.items()
        if spec.required and key not in value
    ]
    for key, item in value.items():
        if key in schema.fields:
            found += _check(schema.fields[key], item, f"{path}.{key}".lstrip("."))
    return found


def _check_scalar(schema: F, value: Any, where: str) -> list[str]:
    kind = schema.type
    if kind is T.STRING and not isinstance(value, str):
        return [f"{where}: a string was expected, not {value!r}"]
    if kind is T.BOOLEAN and not isinstance(value, bool):
        return [f"{where}: a boolean was expected, not {value!r}"]
    if kind is T.INT32 and (isinstance(value, bool) or not isinstance(value, int) or not INT32[0] <= value <= INT32[1]):
        return [f"{where}: a 32-bit integer was expected, not {value!r}"]
    if kind is T.NUMBER and (isinstance(value, bool) or not isinstance(value, int | float)):
        return [f"{where}: a number was expected, not {value!r}"]
    if schema.enum and value not in schema.enum:
        return [f"{where}: {value!r} is not one of {', '.join(schema.enum)}"]
    if schema.minimum is not None and value < schema.minimum:
        return [f"{where}: {value!r} is below the minimum {schema.minimum}"]
    return []


def _check_kubernetes(kind: T, value: Any, where: str) -> list[str]:
    """A Kubernetes type inside a KubeRay object, checked strictly against the Kubernetes schemas by wrapping it in
    the smallest object that holds it (a PodTemplate for a PodTemplateSpec, a ConfigMap for an ObjectMeta)."""
    if not isinstance(value, dict):
        return [f"{where}: an object was expected"]
    if kind is T.POD_TEMPLATE:
        wrapped = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"}, "template": value}
    elif kind is T.OBJECT_META:
        wrapped = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": value}
    else:
        wrapped = {"apiVersion": "v1", "kind": "Service", **value}
    try:
        kubernetes_validate.validate(wrapped, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        return [f"{where}: not a valid {kind.value}: {exc.message}"]
    return []


# -- what the operator checks before it acts (utils/validation.go) --------------------------------------------


def operator_problems(manifest: Mapping[str, Any]) -> list[str]:
    """The rules of KubeRay's own validation that the portal's manifests could break: names, containers, a fixed
    worker group's bounds, the parameters KubeRay reserves, the Ray version token authentication needs, and a
    RayJob's shape. The operator refuses an object that breaks one (it never starts its pods)."""
    kind, name = manifest.get("kind"), (manifest.get("metadata") or {}).get("name", "")
    found = []
    if not DNS_1035.match(name) or len(name) > MAX_NAME.get(str(kind), 0):
        found.append(f"metadata.name: {name!r} is not a DNS-1035 label of at most {MAX_NAME.get(str(kind))}")
    spec = manifest.get("spec") or {}
    if kind == "RayJob":
        found += _rayjob_problems(spec)
        spec = spec.get("rayClusterSpec") or {}
    return found + _raycluster_problems(spec)


def _rayjob_problems(spec: Mapping[str, Any]) -> list[str]:
    found = []
    if not spec.get("rayClusterSpec") and not spec.get("clusterSelector"):
        found.append("spec: one of rayClusterSpec or clusterSelector must be set")
    if spec.get("suspend") and not spec.get("shutdownAfterJobFinishes"):
        found.append("spec.suspend: only with shutdownAfterJobFinishes")
    if spec.get("activeDeadlineSeconds") is not None and spec["activeDeadlineSeconds"] <= 0:
        found.append("spec.activeDeadlineSeconds: must be positive")
    if (spec.get("backoffLimit") or 0) < 0:
        found.append("spec.backoffLimit: must not be negative")
    if spec.get("submissionMode") == "SidecarMode" and spec.get("submitterPodTemplate"):
        found.append("spec.submitterPodTemplate: not supported in SidecarMode")
    if spec.get("deletionStrategy") and spec.get("shutdownAfterJobFinishes"):
        found.append("spec.deletionStrategy: rules are incompatible with shutdownAfterJobFinishes")
    return found


def _raycluster_problems(spec: Mapping[str, Any]) -> list[str]:
    found = []
    head = spec.get("headGroupSpec") or {}
    groups = [
        ("headGroupSpec", head),
        *[(f"workerGroupSpecs[{i}]", g) for i, g in enumerate(spec.get("workerGroupSpecs") or [])],
    ]
    for where, group in groups:
        if not ((group.get("template") or {}).get("spec") or {}).get("containers"):
            found.append(f"{where}: needs at least one container")
        params = group.get("rayStartParams") or {}
        if "labels" in params:
            found.append(f"{where}.rayStartParams: 'labels' is not supported")
        if group.get("resources") and any(params.get(k) for k in ("num-cpus", "num-gpus", "memory", "resources")):
            found.append(f"{where}: resources in both rayStartParams and resources")
    for where, group in groups[1:]:
        low, high = group.get("minReplicas"), group.get("maxReplicas")
        if not spec.get("enableInTreeAutoscaling") and (low is None or high is None):
            found.append(f"{where}: minReplicas and maxReplicas are needed without autoscaling")
        elif low is not None and high is not None and not 0 <= low <= high:
            found.append(f"{where}: minReplicas {low} and maxReplicas {high} are not 0 <= min <= max")
    auth = spec.get("authOptions") or {}
    if auth.get("mode") == "token":
        version = tuple(int(part) for part in re.findall(r"\d+", str(spec.get("rayVersion") or ""))[:3])
        if not version or version < MIN_RAY_VERSION_FOR_TOKEN_AUTH:
            found.append(
                f"spec.rayVersion: token authentication needs Ray 2.52.0 or later, not {spec.get('rayVersion')!r}"
            )
    return found
