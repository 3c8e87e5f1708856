"""Kubernetes manifests for an instance of kind "vcluster", as pure functions (see kubernetes_objects).

A vcluster is a virtual cluster whose control plane runs in the instance's host namespace: the host namespace
gets the same Namespace (Pod Security "restricted"), ResourceQuota, LimitRange and default-deny NetworkPolicy
as any instance's, plus a policy that lets the ingress controller in; a Job in it installs the vcluster's Helm
chart with `vcluster_values`. Users reach the vcluster, never the host namespace.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from workers.backends import kubernetes_objects as ko

# The vcluster Helm chart these values are written for: `helm install <name> vcluster --repo
# https://charts.loft.sh --version 0.30.0 -n <namespace> -f values.yaml` (the vcluster.yaml format of 0.20+).
VCLUSTER_CHART_REPO = "https://charts.loft.sh"
VCLUSTER_CHART_NAME = "vcluster"
VCLUSTER_CHART_VERSION = "0.30.0"
VCLUSTER_INSTALLER = "gpuportal-vcluster-install"
VCLUSTER_VALUES_FILE = "values.yaml"
NETWORK_POLICY_VCLUSTER_INGRESS = "gpuportal-vcluster-from-ingress"


def vcluster_ingress_network_policy(owner: ko.Owner, settings: ko.KubeSettings) -> ko.Manifest:
    """In a vcluster's host namespace the ingress controller may reach every pod, on any port: the vcluster's
    API server and whatever the Ingresses it syncs from the virtual cluster name (their pods carry no label
    of ours). Other namespaces stay out."""
    return ko.ingress_controller_network_policy(owner, settings, NETWORK_POLICY_VCLUSTER_INGRESS, {}, None)


def vcluster_release_name(owner: ko.Owner) -> str:
    return ko.dns_name("vc", owner.instance, max_length=53)  # Helm release names: at most 53 characters


def vcluster_values(owner: ko.Owner, settings: ko.KubeSettings, *, api_server_url: str) -> dict[str, Any]:
    """Helm values for the vcluster chart (VCLUSTER_CHART_*), installed into the instance's namespace.

    The chart's own quota, limit range and network policy stay off: the host namespace's objects from
    `vcluster_host_objects` bound everything the virtual cluster syncs down to it. Its host namespace enforces
    "restricted" like every other, so the chart's pods are given the same security contexts as the portal's:
    the control plane (whose chart default is to run as root), its distro's init container and CoreDNS.
    The pods the vcluster syncs from the virtual cluster are its users' and must pass "restricted" themselves.
    """
    pod_context = ko.pod_security_context(settings)
    container_context = ko.container_security_context() | {
        # The chart sets runAsUser/runAsGroup 0 on the control plane's container: override them, not just the pod's.
        "runAsNonRoot": True,
        "runAsUser": settings.pod_run_as_user,
        "runAsGroup": settings.pod_run_as_group,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    security = {"podSecurityContext": pod_context, "containerSecurityContext": container_context}
    return {
        "controlPlane": {
            "distro": {"k8s": {"enabled": True, "securityContext": dict(container_context)}},
            "statefulSet": {"security": copy.deepcopy(security)},
            "coredns": {"security": copy.deepcopy(security)},
        },
        "sync": {"toHost": {"ingresses": {"enabled": True}}},
        "policies": {
            "resourceQuota": {"enabled": False},
            "limitRange": {"enabled": False},
            "networkPolicy": {"enabled": False},
        },
        "exportKubeConfig": {
            "server": api_server_url,
            "secret": {"name": f"{vcluster_release_name(owner)}-kubeconfig"},
        },
    }


def vcluster_host_objects(owner: ko.Owner, profile: ko.Size, settings: ko.KubeSettings) -> list[ko.Manifest]:
    """The host namespace a vcluster lives in: users reach the vcluster, not the host, so no RoleBinding."""
    return [
        ko.namespace(owner, settings),
        ko.resource_quota(owner, profile, settings),
        ko.limit_range(owner, profile, settings),
        ko.network_policy(owner, settings),
        vcluster_ingress_network_policy(owner, settings),
    ]


def vcluster_kubeconfig_secret_name(owner: ko.Owner) -> str:
    """The Secret the vcluster writes its kubeconfig to (key "config"), as `vcluster_values` asks."""
    return f"{vcluster_release_name(owner)}-kubeconfig"


def vcluster_installer_objects(owner: ko.Owner, settings: ko.KubeSettings, *, api_server_url: str) -> list[ko.Manifest]:
    """A Job in the host namespace that runs `helm upgrade --install` of the vcluster chart with our values.

    The values travel in a ConfigMap (JSON, which Helm reads as YAML). The Job's service account is bound to
    the built-in `admin` ClusterRole in this namespace only, for the chart's namespaced objects (StatefulSet,
    Services, Secrets, its Role and RoleBinding). The pod is small (`helper_resources()`), within the quota.
    It passes the "restricted" profile like every other pod: helm needs no root, only a writable $HOME (/tmp).
    """
    ns, labels = ko.namespace_name(owner, settings), ko.portal_labels(owner, "vcluster", owner.instance)
    values = json.dumps(vcluster_values(owner, settings, api_server_url=api_server_url), indent=2, sort_keys=True)
    config_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": ko.object_meta(VCLUSTER_INSTALLER, labels, ns),
        "data": {VCLUSTER_VALUES_FILE: values},
    }
    account = {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": ko.object_meta(VCLUSTER_INSTALLER, labels, ns),
        "automountServiceAccountToken": False,  # the installer's pod asks for it by name
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": ko.object_meta(VCLUSTER_INSTALLER, labels, ns),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "admin"},
        "subjects": [{"kind": "ServiceAccount", "name": VCLUSTER_INSTALLER, "namespace": ns}],
    }
    helm = [
        "helm", "upgrade", "--install", vcluster_release_name(owner), VCLUSTER_CHART_NAME,
        "--repo", VCLUSTER_CHART_REPO, "--version", VCLUSTER_CHART_VERSION, "--namespace", ns,
        "--values", f"/values/{VCLUSTER_VALUES_FILE}", "--wait", "--timeout", "10m",
    ]  # fmt: skip
    container = {
        "name": "helm",
        "image": settings.helm_image,
        "command": helm,
        "env": [{"name": "HOME", "value": "/tmp"}],  # helm's cache and config
        "volumeMounts": [{"name": "values", "mountPath": "/values", "readOnly": True}],
        "resources": ko.helper_resources(),
    }
    # helm talks to the API server, so this pod (and no other in the namespace) mounts its account's token.
    pod_spec = ko.restricted_pod_spec(
        [container],
        settings,
        service_account=VCLUSTER_INSTALLER,
        restartPolicy="Never",
        volumes=[{"name": "values", "configMap": {"name": VCLUSTER_INSTALLER}}],
    )
    installer = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": ko.object_meta(VCLUSTER_INSTALLER, labels, ns),
        "spec": {
            "backoffLimit": 2,
            "activeDeadlineSeconds": 1200,
            "template": {"metadata": {"labels": dict(labels)}, "spec": pod_spec},
        },
    }
    return [config_map, account, binding, installer]


def vcluster_objects(
    owner: ko.Owner, profile: ko.Size, settings: ko.KubeSettings, *, api_server_url: str
) -> list[ko.Manifest]:
    """Everything an instance of kind "vcluster" is, in the order to create it."""
    return [
        *vcluster_host_objects(owner, profile, settings),
        *vcluster_installer_objects(owner, settings, api_server_url=api_server_url),
    ]
