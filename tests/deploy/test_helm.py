"""The Helm chart (deploy/helm/gpuportal): linted and rendered by Helm with each value set, every object checked
against the Kubernetes schemas of each supported version (``kubernetes-validate --strict``), the production
environment it gives the pods run through ``check --deploy`` and through the web process and its probes, and
its objects applied to the Kubernetes API emulator, where the portal's Kubernetes backend then runs against the
cluster the chart registers, within the rights the chart's ClusterRole grants.

No image is built and no real cluster runs here: admission, RBAC enforcement and NetworkPolicies are
checked against the rules as written (docs/install.md says what is not tested).
"""

from __future__ import annotations

import io
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import requests
from django.conf import settings
from django.core.management import CommandError, call_command
from django.db import connection

from apps.inventory.models import Cluster, Node
from tests.backends.kmock_cluster import Emulator, running_emulator
from tests.deploy.helm import (
    CHART,
    KUBERNETES_VERSIONS,
    ROOT,
    VALUE_SETS,
    container_env,
    find,
    helm,
    render,
)
from tests.deploy.rbac import Rules, backend_calls, request_rule
from tests.workers.conftest import _database_url_for
from workers.backends import kubernetes_reservations as kr
from workers.backends.base import InstanceSpec
from workers.backends.registry import backend_for

PROCESSES = {"web", "worker-quick", "worker-provision", "scheduler", "proxy"}


@pytest.mark.parametrize("values", sorted(VALUE_SETS))
def test_helm_lints_the_chart(values: str) -> None:
    linted = helm("lint", str(CHART), "--strict", "-f", str(VALUE_SETS[values]), check=False)
    assert linted.returncode == 0, linted.stdout + linted.stderr


@pytest.mark.parametrize("values", sorted(VALUE_SETS))
def test_every_rendered_object_is_valid_on_each_supported_kubernetes(values: str) -> None:
    for version in KUBERNETES_VERSIONS:
        objects = render(values, kube_version=version)
        invalid = []
        for obj in objects:
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                invalid.append(f"{obj['kind']} {obj['metadata']['name']}: {exc}")
        assert invalid == [], f"Kubernetes {version}"


def test_the_chart_refuses_an_older_kubernetes() -> None:
    refused = helm("template", "gp", str(CHART), "-f", str(VALUE_SETS["minimal"]), "--kube-version", "1.29.0",
                   check=False)  # fmt: skip
    assert refused.returncode != 0 and "kubeVersion" in refused.stderr


def test_it_refuses_values_without_the_hosts_or_the_secrets() -> None:
    bare = helm("template", "gp", str(CHART), check=False)
    assert bare.returncode != 0 and "portal.host must name the portal's host" in bare.stderr
    no_domain = helm("template", "gp", str(CHART), "--set", "portal.host=portal.example.org", check=False)
    assert no_domain.returncode != 0 and "portal.notebookDomain" in no_domain.stderr
    no_key = helm("template", "gp", str(CHART), "-f", str(VALUE_SETS["minimal"]), "--set",
                  "secrets.secretKey.existingSecret=", check=False)  # fmt: skip
    assert no_key.returncode != 0 and "secrets.secretKey: name an existing Secret" in no_key.stderr


def test_it_runs_each_process_of_the_portal_on_the_queues_tasks_are_routed_to() -> None:
    objects = render("full")
    deployments = {o["metadata"]["name"].removeprefix("gp-gpuportal-"): o for o in objects if o["kind"] == "Deployment"}
    assert set(deployments) == PROCESSES
    args = {name: d["spec"]["template"]["spec"]["containers"][0]["args"] for name, d in deployments.items()}
    assert args["web"] == ["web"] and args["scheduler"] == ["scheduler"] and args["proxy"] == ["proxy"]
    queues = {a[a.index("-Q") + 1] for name, a in args.items() if a[0] == "worker"}
    assert queues == {settings.CELERY_TASK_DEFAULT_QUEUE, settings.PROVISION_QUEUE}
    assert deployments["scheduler"]["spec"]["replicas"] == 2
    for deployment in deployments.values():
        pod = deployment["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is True
        assert pod["containers"][0]["resources"]["limits"]
    # The entrypoint knows every process the chart runs.
    entrypoint = (ROOT / "deploy" / "image" / "entrypoint.sh").read_text()
    for first in {a[0] for a in args.values()} | {"migrate", "manage"}:
        assert f"\n  {first})\n" in entrypoint


def test_optional_parts_can_be_left_to_the_operator() -> None:
    objects = render("off")
    kinds = {o["kind"] for o in objects}
    assert not kinds & {"Ingress", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "NetworkPolicy"}
    assert [o["metadata"]["name"] for o in objects if o["kind"] == "Job"] == ["gp-gpuportal-migrate"]
    web = find(objects, "Deployment", "gp-gpuportal-web")
    assert web["spec"]["template"]["spec"]["serviceAccountName"] == "gpuportal-existing"


def test_register_cluster_refuses_connection_settings_that_are_not_a_json_object() -> None:
    for bad, said in (("{oops", "--connection is not JSON"), ("[1]", "--connection must be a JSON object")):
        with pytest.raises(CommandError, match=said):
            call_command("register_cluster", "k8s", "--kind", "kubernetes", "--connection", bad)


def test_migrations_run_before_install_and_upgrade_and_the_cluster_is_registered_after() -> None:
    objects = render("full")
    migrate = find(objects, "Job", "gp-gpuportal-migrate")
    assert migrate["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"
    assert migrate["spec"]["template"]["spec"]["containers"][0]["args"] == ["migrate"]
    # It runs before the chart's ServiceAccount exists, and needs no Kubernetes API.
    assert migrate["spec"]["template"]["spec"]["automountServiceAccountToken"] is False
    register = find(objects, "Job", "gp-gpuportal-register-cluster")
    assert register["metadata"]["annotations"]["helm.sh/hook"] == "post-install,post-upgrade"
    assert register["spec"]["template"]["spec"]["serviceAccountName"] == "gp-gpuportal"


def test_the_ingress_serves_the_portal_and_the_wildcard_host_over_tls() -> None:
    ingress = find(render("full"), "Ingress", "gp-gpuportal")
    rules = {r["host"]: r["http"]["paths"][0]["backend"]["service"]["name"] for r in ingress["spec"]["rules"]}
    assert rules == {"portal.example.org": "gp-gpuportal-web", "*.apps.example.org": "gp-gpuportal-proxy"}
    assert ingress["spec"]["tls"] == [
        {"hosts": ["portal.example.org", "*.apps.example.org"], "secretName": "gpuportal-tls"}
    ]
    assert "tls" not in find(render("minimal"), "Ingress", "gp-gpuportal")["spec"]


def test_network_policies_and_disruption_budgets_are_there_when_asked_for() -> None:
    full, minimal = render("full"), render("minimal")
    budgets = {o["metadata"]["name"] for o in full if o["kind"] == "PodDisruptionBudget"}
    assert budgets == {f"gp-gpuportal-{p}" for p in PROCESSES - {"proxy"}}
    web = find(full, "NetworkPolicy", "gp-gpuportal-web")
    sources = web["spec"]["ingress"][0]["from"]
    assert {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ingress-nginx"}}} in sources
    assert {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}} in sources
    # The proxy's API only from the portal's own processes.
    proxy = find(full, "NetworkPolicy", "gp-gpuportal-proxy")
    api = [rule for rule in proxy["spec"]["ingress"] if rule["ports"] == [{"port": 8001, "protocol": "TCP"}]]
    assert api and "namespaceSelector" not in api[0]["from"][0]
    assert not [o for o in minimal if o["kind"] in ("NetworkPolicy", "PodDisruptionBudget")]


def _web_env(values: str = "full") -> dict[str, str]:
    web = find(render(values), "Deployment", "gp-gpuportal-web")
    return container_env(web["spec"]["template"]["spec"]["containers"][0])


def test_the_production_values_pass_the_deployment_checks(tmp_path: Path) -> None:
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), **_web_env(), "PORTAL_DATA_DIR": str(tmp_path / "data")}
    checked = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "no issues" in checked.stdout


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_the_web_process_answers_the_charts_probes(
    django_db_setup: None, collected_static: Path, tmp_path: Path
) -> None:
    """The image's entrypoint starts the web process with the pods' environment (on the test database, with the
    static files the image's build step collects), and /healthz answers the probes as the kubelet sends them:
    the portal's Host and the Ingress's HTTPS header, which the production settings' host check and HTTPS
    redirect require."""
    web = find(render("full"), "Deployment", "gp-gpuportal-web")
    container = web["spec"]["template"]["spec"]["containers"][0]
    port = _free_port()
    env = {**os.environ, **container_env(container), "PORTAL_DATA_DIR": str(tmp_path / "data"),
           "DATABASE_URL": _database_url_for(connection.settings_dict), "REDIS_URL": os.environ.get("REDIS_URL", ""),
           "PORTAL_WEB_BIND": f"127.0.0.1:{port}", "WEB_CONCURRENCY": "1", "PORTAL_VENV": sys.prefix,
           "STATIC_ROOT": str(collected_static)}  # fmt: skip
    probe = container["readinessProbe"]["httpGet"]
    assert container["livenessProbe"]["httpGet"] == probe and probe["path"] == "/healthz"
    headers = {h["name"]: h["value"] for h in probe["httpHeaders"]}
    log = (tmp_path / "web.log").open("wb")
    process = subprocess.Popen(
        [str(ROOT / "deploy" / "image" / "entrypoint.sh"), *container["args"]],
        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}{probe['path']}"
        deadline, answer = time.monotonic() + 60, None
        while answer is None and time.monotonic() < deadline and process.poll() is None:
            try:
                answer = requests.get(url, headers=headers, timeout=5, allow_redirects=False)
            except requests.ConnectionError:
                time.sleep(0.3)
        assert answer is not None, (tmp_path / "web.log").read_text()
        assert answer.status_code == 200 and answer.json() == {"status": "ok"}
        # Without the Ingress's headers the production settings turn the request away: another host, then plain HTTP.
        assert requests.get(url, timeout=5, allow_redirects=False).status_code == 400
        plain = requests.get(url, headers={"Host": headers["Host"]}, timeout=5, allow_redirects=False)
        assert plain.status_code == 301 and plain.headers["Location"].startswith("https://portal.example.org/")
    finally:
        os.killpg(process.pid, 15)
        process.wait(timeout=30)
        log.close()


def _collection(obj: dict[str, Any], namespace: str) -> str:
    """The API path of the collection an object is created in."""
    group_version, kind = obj["apiVersion"], obj["kind"]
    plural = kind.lower() + ("es" if kind.endswith("s") else "s")
    prefix = f"/api/{group_version}" if "/" not in group_version else f"/apis/{group_version}"
    if kind in ("ClusterRole", "ClusterRoleBinding", "Namespace"):
        return f"{prefix}/{plural}"
    return f"{prefix}/namespaces/{namespace}/{plural}"


@pytest.fixture
def cluster() -> Any:
    with running_emulator() as emulator:
        yield emulator


def _install(cluster: Emulator, objects: list[dict[str, Any]], namespace: str) -> None:
    """What `helm install` sends: the pre-install hooks, the objects, the post-install hooks."""
    cluster.post("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    phase = {"pre-install,pre-upgrade": 0, "post-install,post-upgrade": 2}

    def order(obj: dict[str, Any]) -> int:
        return phase.get((obj["metadata"].get("annotations") or {}).get("helm.sh/hook", ""), 1)

    for obj in sorted(objects, key=order):
        cluster.post(_collection(obj, namespace), obj)
        stored = cluster.get(f"{_collection(obj, namespace)}/{obj['metadata']['name']}")
        assert (
            stored is not None
            and stored["spec" if "spec" in obj else "kind"] == obj["spec" if "spec" in obj else "kind"]
        )


@pytest.mark.django_db
def test_the_backend_runs_on_the_cluster_the_chart_registers_within_its_cluster_role(cluster: Emulator) -> None:
    objects = render("full", namespace="gpu")
    _install(cluster, objects, "gpu")
    role = Rules(find(objects, "ClusterRole", "gp-gpuportal")["rules"])
    binding = find(objects, "ClusterRoleBinding", "gp-gpuportal")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "gp-gpuportal", "namespace": "gpu"}]
    labels = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    allocatable = {"cpu": "32", "memory": "256Gi", "nvidia.com/gpu": "4"}
    for name in ("gpu-a", "gpu-b"):
        cluster.post(
            "/api/v1/nodes", {"metadata": {"name": name, "labels": labels}, "status": {"allocatable": allocatable}}
        )
    already = len(list(cluster.handler))

    # The post-install Job's command, as it runs in the cluster: only the API server's address is the
    # emulator's (in a pod, the client reads it and the ServiceAccount's token from the pod itself).
    job = find(objects, "Job", "gp-gpuportal-register-cluster")
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[:2] == ["manage", "register_cluster"]
    command = args[1:]
    at = command.index("--connection") + 1
    command[at] = json.dumps({**json.loads(command[at]), "host": cluster.url, "start_timeout_s": 5.0,
                              "stop_timeout_s": 5.0})  # fmt: skip
    out = io.StringIO()
    call_command(*command, stdout=out)
    assert "cluster k8s (kubernetes): 2 nodes, 8 GPUs" in out.getvalue()
    k8s = Cluster.objects.get(name="k8s")
    assert k8s.kind == "kubernetes" and k8s.connection["server_url"] == "https://k8s.example.org:6443"
    assert Node.objects.filter(pool__cluster=k8s).count() == 2

    backend = backend_for(k8s)
    backend.start(InstanceSpec(key="instance-dev", workspace="team-a", name="dev", work_dir="/unused",
                               kind="namespace", users=["alice"]))  # fmt: skip
    state = backend.get_state()
    polled = backend_for(k8s)
    polled.load_state(state)
    assert polled.poll().running
    kr.apply_reservation(backend, "gpr-1", nodes=["gpu-a"])
    kr.remove_reservation(backend, "gpr-1")
    polled.stop()

    made = [(r.method.value, r.url.path) for r in list(cluster.handler)[already:]]
    assert made, "the backend made no request"
    denied = sorted({f"{method} {path}" for method, path in made if not role.allows(request_rule(method, path))})
    assert denied == []
    # Its users' RoleBinding names a role the ServiceAccount may bind.
    for binding_obj in cluster.bodies(
        "post", f"/apis/rbac.authorization.k8s.io/v1/namespaces/{state['namespace']}/rolebindings"
    ):
        ref = binding_obj["roleRef"]
        assert role.allows(("rbac.authorization.k8s.io", "clusterroles", "bind", ref["name"]))


def test_the_cluster_role_grants_what_the_backend_calls_and_nothing_more() -> None:
    role = Rules(find(render("minimal"), "ClusterRole", "gp-gpuportal")["rules"])
    needed = backend_calls()
    assert sorted(n for n in needed if not role.allows(n)) == []
    assert sorted(role.grants() - needed) == []


def test_the_chart_reads_every_secret_from_an_existing_secret() -> None:
    objects = render("full")
    assert not [o for o in objects if o["kind"] == "Secret"]
    web = find(objects, "Deployment", "gp-gpuportal-web")["spec"]["template"]["spec"]["containers"][0]
    from_secrets = {e["name"] for e in web["env"] if "valueFrom" in e}
    assert from_secrets == {"SECRET_KEY", "PORTAL_PROXY_AUTH_TOKEN", "DATABASE_URL", "REDIS_URL",
                            "PORTAL_METRICS_TOKEN", "PORTAL_OIDC_CLIENT_SECRET", "EMAIL_HOST_PASSWORD"}  # fmt: skip
