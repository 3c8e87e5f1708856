"""Rendering the Helm chart (deploy/helm/gpuportal) for the tests, with the Helm that deploy/services.sh's
``ensure_helm`` installs, and reading what it rendered."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.ci_skips import in_ci

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "gpuportal"
VALUE_SETS = {name: CHART / "ci" / f"{name}-values.yaml" for name in ("minimal", "full", "off")}
# The Kubernetes versions the chart supports (Chart.yaml's kubeVersion, up to the newest kubernetes-validate knows).
KUBERNETES_VERSIONS = [f"1.{minor}.0" for minor in range(30, 38)]
# What the pods' Secrets hold in the tests that run the portal with a rendered environment.
SECRET_VALUES = {
    ("gpuportal", "secret-key"): "8Zq3vT0x-rK5mW2pL9cY7nB4hJ6gF1dS3aQ8eU0iO5tR2yH7wE4uI9oP6lK1jN3m",
    ("gpuportal", "proxy-token"): "proxy-token-" + "p" * 32,
    ("gpuportal", "metrics-token"): "metrics-token-" + "m" * 32,
    ("gpuportal-database", "url"): "postgres://gpuportal:gpuportal@db.example.org:5432/gpuportal",
    ("gpuportal-redis", "url"): "redis://:secret@redis.example.org:6379/0",
    ("gpuportal-oidc", "client-secret"): "oidc-client-secret",
    ("gpuportal-smtp", "password"): "smtp-password",
}


def helm_binary() -> Path:
    """Where ensure_helm installs Helm: the version pinned in deploy/services.sh, under the tools directory."""
    services = (ROOT / "deploy" / "services.sh").read_text()
    found = re.search(r"^HELM_VERSION=([\d.]+)$", services, re.MULTILINE)
    assert found, "deploy/services.sh pins HELM_VERSION"
    tools = Path(os.environ.get("PORTAL_TOOLS_DIR") or Path.home() / ".cache" / "gpuportal" / "tools")
    return tools / f"helm-v{found.group(1)}" / "helm"


def require_helm() -> Path:
    helm = helm_binary()
    if not os.access(helm, os.X_OK):
        message = f"Helm is not installed at {helm}: deploy/test.sh installs it (ensure_helm in deploy/services.sh)"
        if in_ci(os.environ):
            pytest.fail(message)
        pytest.skip(message)
    return helm


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    home = Path("/tmp/gpuportal-helm")  # Helm's cache and configuration, none of the user's
    env = {**os.environ, **{f"HELM_{kind}_HOME": str(home / kind.lower()) for kind in ("CACHE", "CONFIG", "DATA")}}
    return subprocess.run(
        [str(require_helm()), *args], capture_output=True, text=True, env=env, check=check, timeout=120
    )


def render(
    values: str | None = "full", *, sets: tuple[str, ...] = (), kube_version: str | None = None, namespace: str = "gpu"
) -> list[dict[str, Any]]:
    """The chart's objects as ``helm template`` renders them for the release ``gp``, hooks included."""
    args = ["template", "gp", str(CHART), "--namespace", namespace]
    if values is not None:
        args += ["-f", str(VALUE_SETS[values])]
    for item in sets:
        args += ["--set", item]
    if kube_version:
        args += ["--kube-version", kube_version]
    return [doc for doc in yaml.safe_load_all(helm(*args).stdout) if doc]


def find(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    matches = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(matches) == 1, f"{kind} {name}: {len(matches)} rendered"
    return matches[0]


def container_env(container: dict[str, Any], secrets: dict[tuple[str, str], str] | None = None) -> dict[str, str]:
    """A container's environment as the kubelet gives it, its Secrets' keys read from ``secrets``."""
    secrets = SECRET_VALUES if secrets is None else secrets
    env: dict[str, str] = {}
    for item in container.get("env") or []:
        if "value" in item:
            env[item["name"]] = item["value"]
        else:
            ref = item["valueFrom"]["secretKeyRef"]
            env[item["name"]] = secrets[(ref["name"], ref["key"])]
    return env
