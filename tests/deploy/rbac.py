"""Kubernetes RBAC for the chart's tests: which rule a request needs, which rules a ClusterRole grants, and
every call the portal's Kubernetes backend can make (read from its code and the official client)."""

from __future__ import annotations

import contextlib
import importlib
import inspect
import re
from pathlib import Path
from typing import Any

from kubernetes import client

from workers.backends import kubernetes as kb

ROOT = Path(__file__).resolve().parents[2]
# (API group, resource[/subresource], verb, the object's name or None for any)
Rule = tuple[str, str, str, str | None]
# The modules whose objects name roles in RoleBindings.
BUILDERS = ("kubernetes_objects", "kubernetes_vcluster")
_VERBS = {"POST": "create", "PATCH": "patch", "PUT": "update", "DELETE": "delete"}


def request_rule(method: str, path: str) -> Rule:
    """The rule an API request needs: ``GET /api/v1/namespaces/x/pods/p/log`` needs ``("", "pods/log", "get", "p")``."""
    parts = path.strip("/").split("/")
    group, rest = ("", parts[2:]) if parts[0] == "api" else (parts[1], parts[3:])
    if rest[0] == "namespaces" and len(rest) >= 3:
        rest = rest[2:]  # a namespaced resource
    resource = rest[0] + (f"/{rest[2]}" if len(rest) > 2 else "")
    name = rest[1] if len(rest) > 1 else None
    verb = ("get" if name else "list") if method.upper() == "GET" else _VERBS[method.upper()]
    return group, resource, verb, name


class Rules:
    """A ClusterRole's rules."""

    def __init__(self, rules: list[dict[str, Any]]) -> None:
        self.rules = rules

    def allows(self, needed: Rule) -> bool:
        group, resource, verb, name = needed
        return any(
            group in rule.get("apiGroups", [])
            and resource in rule.get("resources", [])
            and verb in rule.get("verbs", [])
            and (not rule.get("resourceNames") or name in rule["resourceNames"])
            for rule in self.rules
        )

    def grants(self) -> set[Rule]:
        return {
            (group, resource, verb, name)
            for rule in self.rules
            for group in rule.get("apiGroups", [])
            for resource in rule.get("resources", [])
            for verb in rule.get("verbs", [])
            for name in rule.get("resourceNames") or [None]
        }


class _Stop(Exception):
    pass


class _Recorder:
    """Stands in for the client's ApiClient: records the request a method would send, and sends nothing."""

    def __init__(self) -> None:
        self.sent: tuple[str, str] | None = None

    def param_serialize(self, method: str, resource_path: str, path_params: dict[str, Any], **_: Any) -> None:
        for key, value in (path_params or {}).items():
            resource_path = resource_path.replace("{" + key + "}", str(value))
        self.sent = (method, resource_path)
        raise _Stop

    def select_header_accept(self, *_: Any, **__: Any) -> None:
        return None

    def select_header_content_type(self, *_: Any, **__: Any) -> None:
        return None


def client_rule(api_class: type[Any], method_name: str, **known: str) -> Rule:
    """The rule a call of the official client's ``api_class.method_name`` needs (for any object's name)."""
    recorder = _Recorder()
    method = getattr(api_class, method_name)
    raw = getattr(method, "raw_function", method)  # past the client's argument validation
    required = {
        p.name: known.get(p.name, "x")
        for p in inspect.signature(raw).parameters.values()
        if p.name != "self" and p.default is inspect.Parameter.empty
    }
    with contextlib.suppress(_Stop):
        raw(api_class(api_client=recorder), **required)
    assert recorder.sent is not None, f"{api_class.__name__}.{method_name} sent nothing"
    group, resource, verb, _ = request_rule(*recorder.sent)
    return group, resource, verb, None


def _listed_kinds() -> set[str]:
    """The kinds the backend LISTs: what a reconcile pass lists for every kind of workload, and pods."""
    states = [
        {"namespace": "x", "kind": kind, "instance_kind": "vcluster", "ray_kind": ray_kind}
        for kind in ("job", "notebook", "inference", "instance", "ray")
        for ray_kind in kb._CUSTOM
    ]
    source = (ROOT / "workers" / "backends" / "kubernetes.py").read_text()
    listed_alone = set(re.findall(r'self\._list\("(\w+)"', source))
    return {kind for state in states for kind, _ in kb._lists_for(state)} | listed_alone


def backend_calls() -> set[Rule]:
    """Every rule the backend's calls can need: the objects it creates, reads, patches and deletes (its kinds'
    table), the kinds it lists, the client methods it calls by name, and `bind` on the roles its RoleBindings
    name."""
    needed: set[Rule] = set()
    listed = _listed_kinds()
    for kind, (api_class, suffix) in kb._RESOURCES.items():
        for verb in ("create", "read", "patch", "delete", *(("list",) if kind in listed else ())):
            needed.add(client_rule(api_class, f"{verb}_{suffix}"))
    for kind, (group, version, plural) in kb._CUSTOM.items():
        for verb in ("create", "read", "patch", "delete", *(("list",) if kind in listed else ())):
            method = f"{kb._CUSTOM_VERBS[verb]}_namespaced_custom_object"
            needed.add(client_rule(client.CustomObjectsApi, method, group=group, version=version, plural=plural))
    for path in sorted((ROOT / "workers" / "backends").glob("kubernetes*.py")):
        module = importlib.import_module(f"workers.backends.{path.stem}")
        # A module's custom objects: its own GROUP, VERSION, PLURAL where it has them, else KubeRay's kinds.
        own = getattr(module, "GROUP", None), getattr(module, "VERSION", None), getattr(module, "PLURAL", None)
        custom = [own] if all(own) else list(kb._CUSTOM.values())
        for api_name, method in set(re.findall(r'_invoke\(\s*client\.(\w+),\s*"(\w+)"', path.read_text())):
            api_class = getattr(client, api_name)
            if api_class is client.CustomObjectsApi:
                for group, version, plural in custom:
                    needed.add(client_rule(api_class, method, group=group, version=version, plural=plural))
            else:
                needed.add(client_rule(api_class, method))
    builders = [
        (ROOT / "workers" / "backends" / f"{name}.py").read_text()
        for name in ("kubernetes_objects", "kubernetes_vcluster")
    ]
    for role in {r for text in builders for r in re.findall(r'"kind": "ClusterRole", "name": "(\w+)"', text)}:
        needed.add(("rbac.authorization.k8s.io", "clusterroles", "bind", role))
    return needed
