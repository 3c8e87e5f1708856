"""Tenant isolation in the Kubernetes backend's manifests, checked by rule rather than by example.

Two small evaluators stand in for the parts of a cluster that no test here can run:

- ``restricted_violations`` is the "restricted" Pod Security Standard (the checks Pod Security Admission makes,
  baseline's included), applied to a pod spec. It runs on every pod spec found anywhere in every manifest the
  builders produce, so a new builder's pods are checked without a new test.
- ``ingress_allowed`` is NetworkPolicy ingress semantics: would a pod in namespace X with labels L reach this
  pod on this port, given the namespace's policies.

Both are tested themselves, on specs and policies that break or satisfy each rule.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import pytest

from tests.backends.test_kubernetes_objects import CASES, every_manifest
from workers.backends import kubernetes_objects as ko
from workers.backends import kubernetes_vcluster as kv

Json = dict[str, Any]

# -- the "restricted" Pod Security Standard ---------------------------------------------------------------
# https://kubernetes.io/docs/concepts/security/pod-security-standards/ (baseline, then restricted)

SAFE_SYSCTLS = {
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
}
SELINUX_TYPES = {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}
RESTRICTED_VOLUMES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}
VOLUME_META = {"name"}
CONFINED_SECCOMP = {"RuntimeDefault", "Localhost"}


def _containers(pod: Json) -> Iterator[Json]:
    for key in ("initContainers", "containers", "ephemeralContainers"):
        yield from pod.get(key) or []


def _contexts(pod: Json) -> Iterator[tuple[str, Json]]:
    """(where, securityContext) for the pod and each of its containers."""
    yield "pod", pod.get("securityContext") or {}
    for container in _containers(pod):
        yield f"container {container.get('name')!r}", container.get("securityContext") or {}


def restricted_violations(pod: Json) -> list[str]:
    """Every rule of the "restricted" profile the pod spec breaks, as "<rule>: <where>" (empty: it passes)."""
    found: list[str] = []
    pod_context = pod.get("securityContext") or {}
    containers = list(_containers(pod))

    # Baseline.
    for where, context in _contexts(pod):
        if (context.get("windowsOptions") or {}).get("hostProcess"):
            found.append(f"host process: {where}")
        selinux = context.get("seLinuxOptions") or {}
        if selinux.get("type", "") not in SELINUX_TYPES or selinux.get("user") or selinux.get("role"):
            found.append(f"selinux: {where}")
        if (context.get("appArmorProfile") or {}).get("type", "RuntimeDefault") not in {"RuntimeDefault", "Localhost"}:
            found.append(f"apparmor: {where}")
        if context.get("procMount", "Default") != "Default":
            found.append(f"proc mount: {where}")
        if context.get("privileged"):
            found.append(f"privileged: {where}")
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(key):
            found.append(f"host namespaces: {key}")
    for container in containers:
        if any(port.get("hostPort") for port in container.get("ports") or []):
            found.append(f"host ports: container {container.get('name')!r}")
    for sysctl in pod_context.get("sysctls") or []:
        if sysctl.get("name") not in SAFE_SYSCTLS:
            found.append(f"sysctls: {sysctl.get('name')}")

    # Restricted.
    for volume in pod.get("volumes") or []:
        kinds = set(volume) - VOLUME_META
        if "hostPath" in kinds:
            found.append(f"host path volumes: {volume.get('name')!r}")
        if not kinds <= RESTRICTED_VOLUMES:
            found.append(f"volume types: {volume.get('name')!r} is {sorted(kinds)}")
    pod_non_root = pod_context.get("runAsNonRoot")
    pod_seccomp = (pod_context.get("seccompProfile") or {}).get("type")
    if pod_non_root is False:
        found.append("running as non-root: pod sets runAsNonRoot false")
    if pod_context.get("runAsUser") == 0:
        found.append("running as non-root user: pod runs as uid 0")
    if pod_seccomp is not None and pod_seccomp not in CONFINED_SECCOMP:
        found.append(f"seccomp: pod sets {pod_seccomp}")
    for container in containers:
        name = container.get("name")
        context = container.get("securityContext") or {}
        if context.get("allowPrivilegeEscalation") is not False:
            found.append(f"privilege escalation: container {name!r} does not set allowPrivilegeEscalation false")
        non_root = context.get("runAsNonRoot")
        if non_root is False or (non_root is None and pod_non_root is not True):
            found.append(f"running as non-root: container {name!r}")
        if context.get("runAsUser") == 0:
            found.append(f"running as non-root user: container {name!r} runs as uid 0")
        seccomp = (context.get("seccompProfile") or {}).get("type")
        if (seccomp is not None and seccomp not in CONFINED_SECCOMP) or (seccomp is None and pod_seccomp is None):
            found.append(f"seccomp: container {name!r}")
        capabilities = context.get("capabilities") or {}
        if "ALL" not in (capabilities.get("drop") or []):
            found.append(f"capabilities: container {name!r} does not drop ALL")
        if set(capabilities.get("add") or []) - {"NET_BIND_SERVICE"}:
            found.append(f"capabilities: container {name!r} adds {sorted(capabilities['add'])}")
    return found


def pod_specs(manifest: Json) -> list[tuple[str, Json]]:
    """(path, pod spec) for every pod spec in the manifest, wherever it sits: a Pod's spec, a workload's
    template, a CronJob's job template... A pod spec is any object with a list of containers."""
    found: list[tuple[str, Json]] = []

    def walk(node: Any, path: str) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("containers"), list):
                found.append((path, node))
            for key, value in node.items():
                walk(value, f"{path}.{key}")
        elif isinstance(node, list):
            for i, value in enumerate(node):
                walk(value, f"{path}[{i}]")

    walk(manifest, manifest.get("kind", "?"))
    return found


POD_CASES = [(f"{case_id}:{path}", pod) for case_id, manifest in CASES for path, pod in pod_specs(manifest)]


def test_the_manifests_have_pods_of_every_kind_to_check() -> None:
    # The walk finds the notebooks' StatefulSets, the jobs and the vcluster installer (not a vacuous pass).
    paths = {case_id.split(":", 1)[1] for case_id, _ in POD_CASES}
    assert paths == {"StatefulSet.spec.template.spec", "Job.spec.template.spec"}
    kinds = {case_id.split("-", 1)[0] for case_id, _ in POD_CASES}
    assert kinds >= {"notebook", "job", "vcluster"}


@pytest.mark.parametrize("pod", [pod for _, pod in POD_CASES], ids=[i for i, _ in POD_CASES])
def test_every_pod_passes_the_restricted_profile(pod: Json) -> None:
    assert restricted_violations(pod) == []


@pytest.mark.parametrize("pod", [pod for _, pod in POD_CASES], ids=[i for i, _ in POD_CASES])
def test_every_pod_runs_as_a_non_root_user_group_and_fs_group(pod: Json) -> None:
    # Stricter than the profile, which leaves the group alone and lets the image pick the user.
    context = pod["securityContext"]
    assert context["runAsNonRoot"] is True
    assert all(context[key] > 0 for key in ("runAsUser", "runAsGroup", "fsGroup"))
    assert context["seccompProfile"] == {"type": "RuntimeDefault"}


@pytest.mark.parametrize("pod", [pod for _, pod in POD_CASES], ids=[i for i, _ in POD_CASES])
def test_a_pod_mounts_a_token_only_when_it_names_its_service_account(pod: Json) -> None:
    assert isinstance(pod["automountServiceAccountToken"], bool)  # explicit: never the account's default
    assert pod["automountServiceAccountToken"] is ("serviceAccountName" in pod)


def test_notebooks_and_jobs_mount_no_token_unless_asked() -> None:
    size = ko.Size(2, 4)
    settings = ko.KubeSettings()
    owner = ko.Owner("vision", "dev")
    job = ko.job(owner, ko.GangJob(name="t", image="i", command="c", size=size), settings)
    notebook = ko.notebook_stateful_set(owner, "lab", "img", size, settings)
    for manifest in (job, notebook):
        pod = manifest["spec"]["template"]["spec"]
        assert pod["automountServiceAccountToken"] is False and "serviceAccountName" not in pod
    asked = ko.job(owner, ko.GangJob(name="t", image="i", command="c", size=size, service_account="default"), settings)
    assert asked["spec"]["template"]["spec"]["automountServiceAccountToken"] is True
    assert asked["spec"]["template"]["spec"]["serviceAccountName"] == "default"
    asked = ko.notebook_stateful_set(owner, "lab", "img", size, settings, service_account="gpuportal-user")
    assert asked["spec"]["template"]["spec"]["automountServiceAccountToken"] is True
    # The vcluster installer runs helm against the API server: the one pod that asks, by name.
    *_, installer = kv.vcluster_installer_objects(owner, settings, api_server_url="https://vc")
    assert installer["spec"]["template"]["spec"]["serviceAccountName"] == kv.VCLUSTER_INSTALLER


def test_every_service_account_the_portal_creates_mounts_no_token_by_default() -> None:
    accounts = [m for _, m in CASES if m["kind"] == "ServiceAccount"]
    assert {a["metadata"]["name"] for a in accounts} == {ko.service_account_name(), kv.VCLUSTER_INSTALLER}
    assert all(a["automountServiceAccountToken"] is False for a in accounts)


def test_the_pods_run_as_the_configured_ids() -> None:
    settings = ko.KubeSettings(pod_run_as_user=4242, pod_run_as_group=4343, pod_fs_group=4444)
    pod = ko.job(ko.Owner("vision", "dev"), ko.GangJob("t", "i", "c", ko.Size(1, 1)), settings)["spec"]["template"]
    assert pod["spec"]["securityContext"] | {} == {
        "runAsNonRoot": True,
        "runAsUser": 4242,
        "runAsGroup": 4343,
        "fsGroup": 4444,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert restricted_violations(pod["spec"]) == []


@pytest.mark.parametrize(
    "field_name,value",
    [
        ("pod_run_as_user", 0),
        ("pod_run_as_group", 0),
        ("pod_fs_group", 0),
        ("pod_run_as_user", -1),
        ("pod_run_as_user", 2**31),
        ("pod_run_as_user", True),
        ("pod_run_as_user", "1000"),
        ("pod_security_version", "1.37"),
        ("pod_security_version", "v2.0"),
        ("ingress_namespace", "Ingress_NGINX"),
    ],
)
def test_it_refuses_settings_that_would_weaken_isolation(field_name: str, value: Any) -> None:
    with pytest.raises(ko.InvalidSettings, match=field_name):
        ko.KubeSettings(**{field_name: value})


def test_a_portal_pod_cannot_share_the_hosts_namespaces() -> None:
    with pytest.raises(ValueError, match="hostNetwork"):
        ko.restricted_pod_spec([{"name": "x", "image": "y"}], ko.KubeSettings(), hostNetwork=True)


# The checker itself: each rule, broken on its own in a pod that otherwise passes, is caught.


def _container(pod: Json) -> Json:
    container: Json = pod["containers"][0]
    return container


def _context(pod: Json) -> Json:
    context: Json = _container(pod)["securityContext"]
    return context


# (what is broken, the rule that must catch it, the change)
BROKEN: list[tuple[str, str, Callable[[Json], None]]] = [
    ("hostNetwork", "host namespaces", lambda p: p.update(hostNetwork=True)),
    ("hostPID", "host namespaces", lambda p: p.update(hostPID=True)),
    ("hostIPC", "host namespaces", lambda p: p.update(hostIPC=True)),
    ("privileged", "privileged", lambda p: _context(p).update(privileged=True)),
    ("hostPath", "host path volumes", lambda p: p.setdefault("volumes", []).append({"name": "h", "hostPath": {}})),
    ("nfs", "volume types", lambda p: p.setdefault("volumes", []).append({"name": "n", "nfs": {"path": "/"}})),
    ("hostPort", "host ports", lambda p: _container(p).setdefault("ports", []).append({"hostPort": 80})),
    ("escalation-unset", "privilege escalation", lambda p: _context(p).pop("allowPrivilegeEscalation")),
    ("escalation", "privilege escalation", lambda p: _context(p).update(allowPrivilegeEscalation=True)),
    ("non-root-unset", "running as non-root", lambda p: p["securityContext"].pop("runAsNonRoot")),
    ("non-root-false", "running as non-root", lambda p: _context(p).update(runAsNonRoot=False)),
    ("uid-0", "running as non-root user", lambda p: p["securityContext"].update(runAsUser=0)),
    ("container-uid-0", "running as non-root user", lambda p: _context(p).update(runAsUser=0)),
    ("seccomp-unset", "seccomp", lambda p: p["securityContext"].pop("seccompProfile")),
    ("unconfined", "seccomp", lambda p: _context(p).update(seccompProfile={"type": "Unconfined"})),
    ("caps-kept", "capabilities", lambda p: _context(p).pop("capabilities")),
    ("cap-added", "capabilities", lambda p: _context(p)["capabilities"].update(add=["SYS_ADMIN"])),
    ("proc-mount", "proc mount", lambda p: _context(p).update(procMount="Unmasked")),
    ("sysctl", "sysctls", lambda p: p["securityContext"].update(sysctls=[{"name": "kernel.msgmax", "value": "1"}])),
    ("selinux-user", "selinux", lambda p: p["securityContext"].update(seLinuxOptions={"user": "system_u"})),
    ("apparmor", "apparmor", lambda p: _context(p).update(appArmorProfile={"type": "Unconfined"})),
    ("host-process", "host process", lambda p: p["securityContext"].update(windowsOptions={"hostProcess": True})),
    ("init-container", "privilege escalation", lambda p: p.update(initContainers=[{"name": "init", "image": "i"}])),
]  # fmt: skip


@pytest.mark.parametrize("rule,change", [(rule, change) for _, rule, change in BROKEN], ids=[i for i, _, _ in BROKEN])
def test_the_checker_catches_a_pod_that_breaks_a_rule(rule: str, change: Callable[[Json], None]) -> None:
    notebook = ko.notebook_stateful_set(ko.Owner("vision", "dev"), "lab", "img", ko.Size(2, 4), ko.KubeSettings())
    pod = notebook["spec"]["template"]["spec"]
    assert restricted_violations(pod) == []
    broken = copy.deepcopy(pod)
    change(broken)
    violations = restricted_violations(broken)
    assert any(v.split(":")[0] == rule for v in violations), violations


def test_the_checker_accepts_what_restricted_allows() -> None:
    # Per-container settings instead of pod-level ones, NET_BIND_SERVICE, Localhost seccomp, a safe sysctl.
    context = {
        "allowPrivilegeEscalation": False,
        "runAsNonRoot": True,
        "seccompProfile": {"type": "Localhost", "localhostProfile": "p.json"},
        "capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]},
    }
    pod = {
        "securityContext": {"sysctls": [{"name": "net.ipv4.ip_local_port_range", "value": "1024 65535"}]},
        "containers": [{"name": "a", "image": "i", "securityContext": context}],
        "volumes": [{"name": "v", "emptyDir": {}}, {"name": "p", "projected": {"sources": []}}],
    }
    assert restricted_violations(pod) == []


def test_the_vcluster_charts_pods_get_restricted_security_contexts() -> None:
    # The chart's pods are not ours to build, but the contexts the values give them are checked as a pod.
    values = kv.vcluster_values(ko.Owner("vision", "dev"), ko.KubeSettings(), api_server_url="https://vc")
    plane = values["controlPlane"]
    for security, init in [
        (plane["statefulSet"]["security"], plane["distro"]["k8s"]["securityContext"]),
        (
            plane["coredns"]["security"],
            None,
        ),
    ]:
        containers = [{"name": "main", "image": "i", "securityContext": security["containerSecurityContext"]}]
        if init is not None:
            containers.append({"name": "init", "image": "i", "securityContext": init})
        pod = {"securityContext": security["podSecurityContext"], "containers": containers}
        assert restricted_violations(pod) == []
        # The chart sets runAsUser 0 on the control plane's container: the values must override it there.
        assert all(c["securityContext"]["runAsUser"] == 1000 for c in containers)


# -- every builder is covered -----------------------------------------------------------------------------

NOT_OBJECTS = {
    "kubeconfig": "a client's config file, not an object of the cluster",
}
BUILDER_MODULES = (ko, kv)


def _builders() -> list[tuple[Any, str]]:
    """(module, name) of every public function of the builder modules that returns a manifest or a list of them."""
    return sorted(
        (
            (module, name)
            for module in BUILDER_MODULES
            for name, function in inspect.getmembers(module, inspect.isfunction)
            if function.__module__ == module.__name__
            and not name.startswith("_")
            and inspect.signature(function).return_annotation
            in ("Manifest", "list[Manifest]", "ko.Manifest", "list[ko.Manifest]")
            and name not in NOT_OBJECTS
        ),
        key=lambda pair: (pair[0].__name__, pair[1]),
    )


def test_the_checks_above_see_every_builders_output(monkeypatch: pytest.MonkeyPatch) -> None:
    # A builder added to either module must be added to every_manifest() too, and so gets checked.
    builders = _builders()
    assert len(builders) > 20 and (kv, "vcluster_installer_objects") in builders
    called: set[str] = set()
    for module, name in builders:
        function = getattr(module, name)

        def record(*args: Any, _name: str = name, _function: Any = function, **kwargs: Any) -> Any:
            called.add(_name)
            return _function(*args, **kwargs)

        monkeypatch.setattr(module, name, record)
    every_manifest()
    assert {name for _, name in builders} - called == set()
    assert {"restricted_pod_spec", "network_policy", "namespace"} <= called


# -- Pod Security Admission labels --------------------------------------------------------------------------


NAMESPACES = [(case_id, m) for case_id, m in CASES if m["kind"] == "Namespace"]


@pytest.mark.parametrize("namespace", [m for _, m in NAMESPACES], ids=[i for i, _ in NAMESPACES])
def test_every_namespace_enforces_audits_and_warns_restricted(namespace: Json) -> None:
    labels = namespace["metadata"]["labels"]
    for mode in ("enforce", "audit", "warn"):
        assert labels[f"pod-security.kubernetes.io/{mode}"] == "restricted"
        assert labels[f"pod-security.kubernetes.io/{mode}-version"] == "latest"


def test_the_pod_security_version_can_be_pinned() -> None:
    labels = ko.namespace(ko.Owner("vision", "dev"), ko.KubeSettings(pod_security_version="v1.37"))["metadata"]
    assert labels["labels"]["pod-security.kubernetes.io/enforce-version"] == "v1.37"


# -- NetworkPolicy ingress semantics ------------------------------------------------------------------------
# https://kubernetes.io/docs/concepts/services-networking/network-policies/


@dataclass(frozen=True)
class Pod:
    """A pod as a NetworkPolicy sees it: its namespace (and that namespace's labels), its labels, its ports."""

    namespace: str
    labels: Mapping[str, str] = field(default_factory=dict)
    namespace_labels: Mapping[str, str] = field(default_factory=dict)
    named_ports: Mapping[str, int] = field(default_factory=dict)

    def all_namespace_labels(self) -> dict[str, str]:
        # The API server sets this label on every namespace to its name, and nobody can change it.
        return {**self.namespace_labels, ko.NAMESPACE_NAME_LABEL: self.namespace}


def selector_matches(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """A LabelSelector: every matchLabels pair and every matchExpression hold (the empty selector: everything)."""
    if any(labels.get(key) != value for key, value in (selector.get("matchLabels") or {}).items()):
        return False
    for expression in selector.get("matchExpressions") or []:
        key, operator, values = expression["key"], expression["operator"], expression.get("values") or []
        holds = {
            "In": key in labels and labels[key] in values,
            "NotIn": key not in labels or labels[key] not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[operator]
        if not holds:
            return False
    return True


def _peer_matches(peer: Mapping[str, Any], policy_namespace: str, source: Pod) -> bool:
    if "ipBlock" in peer:
        return False  # CIDRs are for traffic from outside the cluster; how they treat pod IPs is the CNI's call
    if "namespaceSelector" in peer:
        namespace_ok = selector_matches(peer["namespaceSelector"], source.all_namespace_labels())
    else:
        namespace_ok = source.namespace == policy_namespace  # a podSelector alone: pods of the policy's namespace
    return namespace_ok and selector_matches(peer.get("podSelector") or {}, source.labels)


def _port_matches(entry: Mapping[str, Any], port: int, protocol: str, target: Pod) -> bool:
    if entry.get("protocol", "TCP") != protocol:
        return False
    wanted = entry.get("port")
    if wanted is None:
        return True
    if isinstance(wanted, str):
        return target.named_ports.get(wanted) == port
    return bool(wanted <= port <= entry.get("endPort", wanted))


def ingress_allowed(policies: Sequence[Json], source: Pod, target: Pod, port: int, protocol: str = "TCP") -> bool:
    """Would the cluster let `source` open a connection to `target` on `port`?

    A pod that no Ingress policy of its namespace selects accepts everything; a selected pod accepts what at
    least one rule of one selecting policy allows (policies add up, none subtracts).
    """
    selecting = [
        p
        for p in policies
        if p["kind"] == "NetworkPolicy"
        and p["metadata"]["namespace"] == target.namespace
        and "Ingress" in p["spec"].get("policyTypes", ["Ingress"])
        and selector_matches(p["spec"]["podSelector"], target.labels)
    ]
    if not selecting:
        return True
    for policy in selecting:
        for rule in policy["spec"].get("ingress") or []:
            peers, ports = rule.get("from") or [], rule.get("ports") or []
            if peers and not any(_peer_matches(peer, policy["metadata"]["namespace"], source) for peer in peers):
                continue
            if ports and not any(_port_matches(entry, port, protocol, target) for entry in ports):
                continue
            return True
    return False


def _policy(namespace: str, spec: Json) -> Json:
    return {"kind": "NetworkPolicy", "metadata": {"name": "p", "namespace": namespace}, "spec": spec}


def test_the_evaluator_follows_networkpolicy_semantics() -> None:
    a, b, web = Pod("a", {"app": "x"}), Pod("b", {"app": "x"}, {"team": "blue"}), Pod("a", {"app": "web"})
    assert ingress_allowed([], b, a, 80)  # no policy: not isolated
    deny_all = _policy("a", {"podSelector": {}, "policyTypes": ["Ingress"]})
    assert not ingress_allowed([deny_all], a, a, 80)
    assert ingress_allowed([deny_all], a, b, 80)  # policies only bind pods of their own namespace
    only_web = _policy("a", {"podSelector": {"matchLabels": {"app": "web"}}, "policyTypes": ["Ingress"]})
    assert ingress_allowed([only_web], b, a, 80) and not ingress_allowed([only_web], b, web, 80)
    # One peer with both selectors is AND; two peers are OR.
    both = {"namespaceSelector": {"matchLabels": {"team": "blue"}}, "podSelector": {"matchLabels": {"app": "y"}}}
    assert not ingress_allowed([_policy("a", {"podSelector": {}, "ingress": [{"from": [both]}]})], b, a, 80)
    either = [{"namespaceSelector": {"matchLabels": {"team": "blue"}}}, {"podSelector": {"matchLabels": {"app": "y"}}}]
    assert ingress_allowed([_policy("a", {"podSelector": {}, "ingress": [{"from": either}]})], b, a, 80)
    # A podSelector alone means pods of the policy's namespace, whatever other namespaces' pods are labelled.
    same = _policy("a", {"podSelector": {}, "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "x"}}}]}]})
    assert ingress_allowed([same], a, web, 80) and not ingress_allowed([same], b, web, 80)
    # An empty `from` is everyone; ports narrow it, by number, range or name.
    ported = _policy("a", {"podSelector": {}, "ingress": [{"ports": [{"port": 8000, "endPort": 8010}]}]})
    assert ingress_allowed([ported], b, a, 8005) and not ingress_allowed([ported], b, a, 8011)
    assert not ingress_allowed([ported], b, a, 8005, "UDP")
    named = _policy("a", {"podSelector": {}, "ingress": [{"ports": [{"port": "http"}]}]})
    assert ingress_allowed([named], b, Pod("a", named_ports={"http": 8888}), 8888)
    assert not ingress_allowed([named], b, Pod("a", named_ports={"http": 8888}), 22)
    expressions = {"matchExpressions": [{"key": "team", "operator": "NotIn", "values": ["red"]}]}
    assert ingress_allowed(
        [_policy("a", {"podSelector": {}, "ingress": [{"from": [{"namespaceSelector": expressions}]}]})], b, a, 1
    )


# -- the portal's policies ----------------------------------------------------------------------------------

SETTINGS = ko.KubeSettings()
PROFILE = ko.Size(8, 64, Decimal(2), "h100")
VISION, OTHER = ko.Owner("vision", "dev"), ko.Owner("other", "dev")


def _pods(owner: ko.Owner, settings: ko.KubeSettings = SETTINGS) -> dict[str, Pod]:
    """The pods that live in an instance's namespace: a notebook (its template's labels) and a user's pod."""
    ns = ko.namespace_name(owner, settings)
    notebook = ko.notebook_stateful_set(owner, "lab", "img", ko.Size(1, 1), settings)["spec"]["template"]
    return {
        "notebook": Pod(ns, notebook["metadata"]["labels"], named_ports={"http": ko.JUPYTER_PORT}),
        "users-pod": Pod(ns, {"app": "mine"}),
    }


def _other_tenants_pods(settings: ko.KubeSettings = SETTINGS) -> list[Pod]:
    """Pods of another workspace, including ones labelled to pass for the portal's notebooks or the ingress."""
    other = _pods(OTHER, settings)
    forged = dict(other["notebook"].labels) | {ko.LABEL_WORKSPACE: "vision"}
    jobs = ko.jobs_namespace_name("other", settings)
    return [
        *other.values(),
        Pod(other["notebook"].namespace, forged),
        Pod(jobs, {"app.kubernetes.io/name": "ingress-nginx"}, {"name": settings.ingress_namespace}),
        Pod("default"),
        Pod("kube-system", {"k8s-app": "kube-dns"}),
    ]


def _policies(objects: list[Json]) -> list[Json]:
    return [o for o in objects if o["kind"] == "NetworkPolicy"]


def test_an_instance_namespace_admits_its_own_pods_and_no_other_tenants() -> None:
    policies = _policies(ko.namespace_objects(VISION, PROFILE, ["alice"], SETTINGS))
    pods = _pods(VISION)
    for target in pods.values():
        for source in pods.values():
            assert ingress_allowed(policies, source, target, 8888) and ingress_allowed(policies, source, target, 22)
        for source in _other_tenants_pods():
            for port in (8888, 22, 29500):
                assert not ingress_allowed(policies, source, target, port), (source, target, port)


def test_the_ingress_controller_reaches_notebooks_on_the_jupyter_port_only() -> None:
    policies = _policies(ko.namespace_objects(VISION, PROFILE, ["alice"], SETTINGS))
    pods = _pods(VISION)
    controller = Pod("ingress-nginx", {"app.kubernetes.io/name": "ingress-nginx"})
    assert ingress_allowed(policies, controller, pods["notebook"], ko.JUPYTER_PORT)
    assert not ingress_allowed(policies, controller, pods["notebook"], 22)
    assert not ingress_allowed(policies, controller, pods["users-pod"], ko.JUPYTER_PORT)
    # The controller's namespace is the setting's, matched by name: another one, or a look-alike, is not it.
    traefik = ko.KubeSettings(ingress_namespace="traefik")
    policies = _policies(ko.namespace_objects(VISION, PROFILE, ["alice"], traefik))
    notebook = _pods(VISION, traefik)["notebook"]
    assert ingress_allowed(policies, Pod("traefik"), notebook, ko.JUPYTER_PORT)
    assert not ingress_allowed(policies, controller, notebook, ko.JUPYTER_PORT)
    assert not ingress_allowed(policies, Pod("mine", namespace_labels={"name": "traefik"}), notebook, 8888)


def test_a_jobs_namespace_admits_only_its_own_gang() -> None:
    jobs_owner = ko.jobs_owner("vision", SETTINGS)
    policies = _policies(ko.jobs_namespace_objects("vision", SETTINGS))
    spec = ko.GangJob("train", "img", "c", ko.Size(1, 1), replicas=2)
    labels = ko.job(jobs_owner, spec, SETTINGS)["spec"]["template"]["metadata"]["labels"]
    rank0, rank1 = Pod(jobs_owner.namespace or "", labels), Pod(jobs_owner.namespace or "", labels)
    assert ingress_allowed(policies, rank1, rank0, SETTINGS.master_port)
    same_workspace_notebook = _pods(VISION)["notebook"]  # another namespace, even of the same workspace
    for source in [same_workspace_notebook, Pod("ingress-nginx"), *_other_tenants_pods()]:
        assert not ingress_allowed(policies, source, rank0, SETTINGS.master_port), source


def test_a_vcluster_host_namespace_admits_the_ingress_controller_and_no_other_tenant() -> None:
    objects = kv.vcluster_objects(VISION, PROFILE, SETTINGS, api_server_url="https://vc")
    policies = _policies(objects)
    ns = ko.namespace_name(VISION, SETTINGS)
    for target in (Pod(ns, {"app": "vcluster", "release": "vc-dev"}), Pod(ns, {"vcluster.loft.sh/managed-by": "x"})):
        assert ingress_allowed(policies, Pod(ns), target, 8443)
        assert ingress_allowed(policies, Pod("ingress-nginx"), target, 8443)
        for source in _other_tenants_pods():
            assert not ingress_allowed(policies, source, target, 8443), source


def test_every_namespace_the_builders_make_comes_with_its_default_deny() -> None:
    # Whatever builder makes a Namespace also makes the policy that closes it to every other namespace.
    groups = [
        ko.namespace_objects(VISION, PROFILE, [], SETTINGS),
        kv.vcluster_host_objects(VISION, PROFILE, SETTINGS),
        kv.vcluster_objects(VISION, PROFILE, SETTINGS, api_server_url="https://vc"),
        ko.jobs_namespace_objects("vision", SETTINGS),
    ]
    for objects in groups:
        (namespace,) = [o for o in objects if o["kind"] == "Namespace"]
        ns = namespace["metadata"]["name"]
        stranger = Pod("somewhere-else", {"any": "label"})
        assert not ingress_allowed(_policies(objects), stranger, Pod(ns, {"any": "label"}), 1234)
        assert ingress_allowed(_policies(objects), Pod(ns), Pod(ns, {"any": "label"}), 1234)
