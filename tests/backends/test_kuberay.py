"""Ray clusters on the Kubernetes backend: KubeRay's RayCluster and RayJob.

No real API server or KubeRay operator runs here (none can be installed on these machines). The manifests are
checked against the fields KubeRay v1.7.0 documents (tests/backends/kuberay_fields.py, written from its API
reference, not copied from its CRD) and their pod templates, Secrets, NetworkPolicies and Namespaces against the
Kubernetes 1.37 schemas; the flows go through the official client over HTTP to kmock's API emulator, with the
tests playing the KubeRay operator's part (writing ``status``, creating pods). Ray's own reading of the token
variables is checked against the installed Ray.
"""

from __future__ import annotations

import ast
import copy
import importlib.metadata
import inspect
import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from decimal import Decimal
from types import SimpleNamespace
from typing import Any

import kubernetes_validate
import pytest

from tests.backends import kuberay_fields
from tests.backends.kmock_cluster import Emulator, running_emulator
from tests.backends.test_kubernetes_isolation import Pod, ingress_allowed, restricted_violations
from workers.backends import BackendError, PolicyRefusal, Status
from workers.backends import kuberay_objects as kro
from workers.backends import kubernetes_objects as ko
from workers.backends.base import TIMEOUT_EXIT_CODE, UNKNOWN_EXIT_CODE, Keep, NodeGroup, RayClusterSpec
from workers.backends.kubernetes import KubernetesBackend
from workers.backends.registry import backend_for

K8S_VERSION = "1.37.0"
SETTINGS = ko.KubeSettings(ingress_mode="path", ingress_host="portal.example.org")
SHARED = ko.KubeSettings(fractional_gpu_resource_name="nvidia.com/gpu.shared", gpu_type_node_label="gpuportal.io/gpu")
OWNER = kro.ray_owner("vision", SETTINGS)
TOKEN = "ray-token-" + "cd" * 24
PORTAL_ENV = {
    "GPUPORTAL_URL": "https://portal.example.org",
    "GPUPORTAL_WORKSPACE": "vision",
    "GPUPORTAL_TOKEN": "gpw_ray_" + "ab" * 32,
}
LONG = "x" * 40 + "-" + "y" * 22


def ray(name: str = "tune", workers: int = 2, **overrides: Any) -> kro.RaySpec:
    fields: dict[str, Any] = {
        "name": name,
        "image": "rayproject/ray:2.60.0-gpu",
        "head": ko.Size(4, 16, Decimal(1), "h100"),
        "worker": ko.Size(8, 64, Decimal(2), "h100"),
        "workers": workers,
        "auth_token": TOKEN,
        "env": {"EPOCHS": "3"},
    }
    return kro.RaySpec(**(fields | overrides))


def every_ray_manifest() -> list[tuple[str, dict[str, Any]]]:
    """Both kinds, with and without GPUs, workers, a portal credential, a deadline; short and long names."""
    cases: list[tuple[str, dict[str, Any]]] = []
    cases += [(f"namespace-{o['kind']}", o) for o in kro.ray_namespace_objects("vision", SETTINGS)]
    cases += [(f"namespace-long-{o['kind']}", o) for o in kro.ray_namespace_objects(LONG, SETTINGS)]
    variants: dict[str, kro.RaySpec] = {
        "cluster": ray(),
        "cluster-no-workers": ray(workers=0),
        "cluster-no-gpu": ray(head=ko.Size(1, 2), worker=ko.Size(2, 4)),
        "cluster-long-name": ray(name=LONG),
        "cluster-portal-env": ray(portal_env=PORTAL_ENV, env={"GPUPORTAL_TOKEN": "mine"}),
        "job": ray(entrypoint="python tune.py --trials 8", max_runtime_s=3600),
        "job-long-name": ray(name=LONG, entrypoint="python tune.py"),
        "job-portal-env": ray(entrypoint="python tune.py", portal_env=PORTAL_ENV),
        "job-small": ray(entrypoint="echo hi", head=ko.Size(0.5, 0.75), worker=ko.Size(0.5, 0.75), workers=1),
    }
    for case, spec in variants.items():
        cases += [(f"{case}-{o['kind']}-{o['metadata']['name']}", o) for o in kro.ray_objects(OWNER, spec, SETTINGS)]
    shared = ray(worker=ko.Size(2, 8, Decimal("0.5"), "a100"), entrypoint="python x.py")
    cases += [(f"fractional-{o['kind']}-{o['metadata']['name']}", o) for o in kro.ray_objects(OWNER, shared, SHARED)]
    return cases


CASES = every_ray_manifest()
KUBERAY_CASES = [(i, m) for i, m in CASES if m["kind"] in ("RayCluster", "RayJob")]
NATIVE_CASES = [(i, m) for i, m in CASES if m["kind"] not in ("RayCluster", "RayJob")]


def pod_templates(manifest: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(role, pod template) of every pod a RayCluster or RayJob asks KubeRay for."""
    spec = manifest["spec"]
    cluster = spec["rayClusterSpec"] if manifest["kind"] == "RayJob" else spec
    found = [("head", cluster["headGroupSpec"]["template"])]
    found += [("worker", group["template"]) for group in cluster["workerGroupSpecs"]]
    if "submitterPodTemplate" in spec:
        found.append(("submitter", spec["submitterPodTemplate"]))
    return found


def env_of(template: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in template["spec"]["containers"][0]["env"]}


# -- the documented fields and the Kubernetes schemas -----------------------------------------------------------


@pytest.mark.parametrize("manifest", [m for _, m in KUBERAY_CASES], ids=[i for i, _ in KUBERAY_CASES])
def test_it_uses_only_the_fields_kuberay_documents(manifest: dict[str, Any]) -> None:
    assert kuberay_fields.problems(manifest) == []
    assert kuberay_fields.operator_problems(manifest) == []


@pytest.mark.parametrize("manifest", [m for _, m in NATIVE_CASES], ids=[i for i, _ in NATIVE_CASES])
def test_its_kubernetes_objects_are_valid_against_the_kubernetes_schema(manifest: dict[str, Any]) -> None:
    kubernetes_validate.validate(manifest, K8S_VERSION, strict=True)


def _broken(change: str) -> dict[str, Any]:
    """A valid RayJob with one mistake."""
    manifest = kro.ray_job(OWNER, ray(entrypoint="python tune.py"), SETTINGS)
    spec, cluster = manifest["spec"], manifest["spec"]["rayClusterSpec"]
    group = cluster["workerGroupSpecs"][0]
    if change == "misspelt":
        cluster["workerGroupSpec"] = cluster.pop("workerGroupSpecs")
    elif change == "misplaced-in-head":
        cluster["headGroupSpec"]["replicas"] = 1
    elif change == "misplaced-entrypoint":
        cluster["entrypoint"] = spec.pop("entrypoint")
    elif change == "wrong-type":
        group["minReplicas"] = "2"
    elif change == "missing-required":
        del group["groupName"]
    elif change == "not-in-enum":
        spec["submissionMode"] = "K8sMode"
    elif change == "pod-template":
        group["template"]["spec"]["containers"][0]["resource"] = group["template"]["spec"]["containers"][0]["resources"]
    elif change == "metadata":
        manifest["metadata"]["label"] = {"a": "b"}
    elif change == "auth-mode":
        cluster["authOptions"]["mode"] = "tokens"
    return manifest


@pytest.mark.parametrize(
    ("change", "where"),
    [
        ("misspelt", "spec.rayClusterSpec.workerGroupSpec: not a field"),
        ("misplaced-in-head", "spec.rayClusterSpec.headGroupSpec.replicas: not a field"),
        ("misplaced-entrypoint", "spec.rayClusterSpec.entrypoint: not a field"),
        ("wrong-type", "spec.rayClusterSpec.workerGroupSpecs[0].minReplicas: a 32-bit integer"),
        ("missing-required", "spec.rayClusterSpec.workerGroupSpecs[0].groupName: required"),
        ("not-in-enum", "spec.submissionMode: 'K8sMode' is not one of"),
        ("pod-template", "spec.rayClusterSpec.workerGroupSpecs[0].template: not a valid PodTemplateSpec"),
        ("metadata", "metadata: not a valid ObjectMeta"),
        ("auth-mode", "spec.rayClusterSpec.authOptions.mode: 'tokens' is not one of"),
    ],
)
def test_the_field_check_catches_a_misspelt_misplaced_or_mistyped_field(change: str, where: str) -> None:
    found = kuberay_fields.problems(_broken(change))
    assert len(found) == 1 and found[0].startswith(where), found


def test_the_operators_rules_catch_what_kuberay_would_refuse() -> None:
    manifest = kro.ray_cluster(OWNER, ray(), SETTINGS)
    cases = {
        "name": lambda m: m["metadata"].update(name="r" * 54),
        "min-max": lambda m: m["spec"]["workerGroupSpecs"][0].update(minReplicas=3, maxReplicas=2),
        "ray-version": lambda m: m["spec"].update(rayVersion="2.51.0"),
        "labels-param": lambda m: m["spec"]["headGroupSpec"]["rayStartParams"].update(labels="a=b"),
    }
    for case, change in cases.items():
        broken = copy.deepcopy(manifest)
        change(broken)
        assert kuberay_fields.problems(broken) == [], case
        assert len(kuberay_fields.operator_problems(broken)) == 1, case
    job = kro.ray_job(OWNER, ray(entrypoint="x"), SETTINGS)
    job["metadata"]["name"] = "r" * 48  # a RayCluster may have it, a RayJob may not
    assert kuberay_fields.operator_problems(job)


def test_the_field_list_is_of_the_pinned_kuberay_release() -> None:
    # Pinning another release means reading its API reference again and updating kuberay_fields.
    assert kuberay_fields.DOCUMENTED_VERSION == kro.KUBERAY_VERSION


def test_the_pinned_ray_version_is_the_installed_one() -> None:
    assert importlib.metadata.version("ray") == kro.RAY_VERSION
    assert f"rayproject/ray:{kro.RAY_VERSION}" == kro.DEFAULT_RAY_IMAGE


# -- what the manifests say -------------------------------------------------------------------------------------


def test_a_ray_cluster_is_a_head_and_one_fixed_worker_group() -> None:
    manifest = kro.ray_cluster(OWNER, ray(), SETTINGS)
    assert manifest["apiVersion"] == "ray.io/v1" and manifest["kind"] == "RayCluster"
    assert manifest["metadata"]["name"] == "ray-tune" and manifest["metadata"]["namespace"] == OWNER.namespace
    spec = manifest["spec"]
    assert spec["enableInTreeAutoscaling"] is False and spec["rayVersion"] == kro.RAY_VERSION
    (group,) = spec["workerGroupSpecs"]
    assert group["groupName"] == "workers"
    assert group["replicas"] == group["minReplicas"] == group["maxReplicas"] == 2
    head = spec["headGroupSpec"]["template"]["spec"]["containers"][0]
    assert head["image"] == "rayproject/ray:2.60.0-gpu"
    assert head["resources"] == {
        "requests": {"cpu": "4", "memory": "16Gi"},
        "limits": {"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": "1"},
    }
    worker = group["template"]["spec"]["containers"][0]
    assert worker["resources"]["limits"] == {"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": "2"}
    assert {p["containerPort"] for p in head["ports"]} == {6379, 8265, 10001}
    assert env_of(spec["headGroupSpec"]["template"])["EPOCHS"] == "3"


def test_it_places_gpu_pods_by_type_and_asks_for_gpu_shares_only_where_the_cluster_has_them() -> None:
    shared = ray(worker=ko.Size(2, 8, Decimal("0.5"), "a100"))
    spec = kro.ray_cluster(OWNER, shared, SHARED)["spec"]
    worker = spec["workerGroupSpecs"][0]["template"]["spec"]
    assert worker["containers"][0]["resources"]["limits"]["nvidia.com/gpu.shared"] == "2"
    assert worker["nodeSelector"] == {"gpuportal.io/gpu": "a100"}
    with pytest.raises(ko.UnsupportedRequest):
        kro.ray_cluster(OWNER, shared, SETTINGS)


@pytest.mark.parametrize("manifest", [m for _, m in KUBERAY_CASES], ids=[i for i, _ in KUBERAY_CASES])
def test_every_ray_pod_is_restricted_labelled_and_has_no_service_account_token(manifest: dict[str, Any]) -> None:
    for role, template in pod_templates(manifest):
        pod = template["spec"]
        assert restricted_violations(pod) == [], role
        assert pod["automountServiceAccountToken"] is False and "serviceAccountName" not in pod
        labels = template["metadata"]["labels"]
        assert labels == manifest["metadata"]["labels"] | {kro.LABEL_ROLE: role}
        assert kuberay_fields.DNS_1035.match(manifest["metadata"]["name"])
        assert all(len(value) <= 63 for value in labels.values())


def test_every_ray_node_reads_the_token_from_the_clusters_secret_and_nothing_else_holds_it() -> None:
    objects = kro.ray_objects(OWNER, ray(entrypoint="python tune.py", portal_env=PORTAL_ENV), SETTINGS)
    secret, job = objects[0], objects[-1]
    assert secret["kind"] == "Secret" and secret["stringData"][kro.AUTH_TOKEN_KEY] == TOKEN
    assert secret["stringData"][ko.PORTAL_TOKEN_KEY] == PORTAL_ENV["GPUPORTAL_TOKEN"]
    assert job["spec"]["rayClusterSpec"]["authOptions"] == {"mode": "token", "secretName": secret["metadata"]["name"]}
    ref = {"secretKeyRef": {"name": secret["metadata"]["name"], "key": kro.AUTH_TOKEN_KEY}}
    for role, template in pod_templates(job):
        env = env_of(template)
        assert env["RAY_AUTH_MODE"] == "token" and env["RAY_AUTH_TOKEN"] == ref, role
    head_env = env_of(job["spec"]["rayClusterSpec"]["headGroupSpec"]["template"])
    assert head_env["GPUPORTAL_TOKEN"] == {"secretKeyRef": {"name": secret["metadata"]["name"], "key": "portal-token"}}
    assert head_env["GPUPORTAL_URL"] == "https://portal.example.org"
    assert "GPUPORTAL_TOKEN" not in env_of(job["spec"]["submitterPodTemplate"])  # it runs `ray job submit` only
    for obj in objects[1:]:
        text = json.dumps(obj)
        assert TOKEN not in text and PORTAL_ENV["GPUPORTAL_TOKEN"] not in text, obj["kind"]


@pytest.mark.parametrize(
    "name", ["RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_REDIS_ADDRESS", "PORTAL_X"]
)
def test_the_users_env_cannot_turn_authentication_off_or_set_what_kuberay_refuses(name: str) -> None:
    with pytest.raises(ko.UnsupportedRequest, match=name):
        kro.ray_cluster(OWNER, ray(env={name: "disabled"}), SETTINGS)


def test_ray_reads_the_token_the_way_the_pods_are_given_it() -> None:
    # The installed Ray (the version the image pins) reads RAY_AUTH_MODE and RAY_AUTH_TOKEN as the pod sets them.
    objects = kro.ray_objects(OWNER, ray(), SETTINGS)
    secret = objects[0]["stringData"]
    env = {}
    for name, value in env_of(objects[-1]["spec"]["headGroupSpec"]["template"]).items():
        env[name] = secret[value["secretKeyRef"]["key"]] if isinstance(value, dict) else value
    code = (
        "from ray._raylet import AuthenticationMode, AuthenticationTokenLoader, get_authentication_mode\n"
        "loader = AuthenticationTokenLoader.instance()\n"
        "print(get_authentication_mode() == AuthenticationMode.TOKEN, loader.get_raw_token())\n"
    )
    clean = {"PATH": os.environ["PATH"], "HOME": "/nonexistent"}
    seen = subprocess.run([sys.executable, "-c", code], env=clean | env, capture_output=True, text=True, timeout=60)
    assert seen.stdout.split() == ["True", TOKEN], seen.stderr
    # Without the token variable Ray refuses to run in token mode: the variable's name matters.
    missing = {k: v for k, v in env.items() if k != "RAY_AUTH_TOKEN"}
    assert subprocess.run([sys.executable, "-c", code], env=clean | missing, capture_output=True, timeout=60).returncode


def test_a_ray_job_wraps_the_cluster_and_shuts_it_down_when_the_job_ends() -> None:
    spec = ray(entrypoint="python tune.py", max_runtime_s=600)
    job = kro.ray_job(OWNER, spec, SETTINGS)
    assert job["kind"] == "RayJob" and job["metadata"]["name"] == "ray-tune"
    assert job["spec"]["shutdownAfterJobFinishes"] is True and job["spec"]["backoffLimit"] == 0
    assert job["spec"]["submissionMode"] == "K8sJobMode" and job["spec"]["activeDeadlineSeconds"] == 600
    assert job["spec"]["rayClusterSpec"] == kro.ray_cluster_spec(OWNER, spec, SETTINGS)
    assert job["spec"]["submitterPodTemplate"]["spec"]["restartPolicy"] == "Never"
    assert [o["kind"] for o in kro.ray_objects(OWNER, spec, SETTINGS)] == [
        "Secret",
        "NetworkPolicy",
        "NetworkPolicy",
        "RayJob",
    ]
    assert kro.ray_objects(OWNER, ray(), SETTINGS)[-1]["kind"] == "RayCluster"


def _through_kuberays_submitter(entrypoint: str) -> str:
    """The Ray job's entrypoint as the submitter makes it: KubeRay pastes ``entrypoint`` into a shell script after
    ``ray job submit ... --``, and Ray's CLI joins the words it gets with ``shlex.join``."""
    cli = "import shlex, sys; print(shlex.join(sys.argv[2:]))"  # after "--", which click consumes
    script = f"{shlex.quote(sys.executable)} -c {shlex.quote(cli)} -- {entrypoint} ;"
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True).stdout.rstrip("\n")


def test_the_whole_entrypoint_runs_as_the_ray_job_never_in_the_submitter() -> None:
    command = 'echo "a  b" && echo $((6 * 7)); echo done > /dev/null; printf "%s" \'q\''
    expected = subprocess.run(["sh", "-c", command], capture_output=True, text=True).stdout
    ray_entrypoint = _through_kuberays_submitter(kro.job_entrypoint(command))
    assert subprocess.run(["sh", "-c", ray_entrypoint], capture_output=True, text=True).stdout == expected
    # Unquoted, the submitter's shell would have split it and run part of it itself.
    assert _through_kuberays_submitter(command) != ray_entrypoint


# -- where it runs, and who reaches it --------------------------------------------------------------------------


def _pods(spec: kro.RaySpec, namespace: str | None = None) -> dict[str, Pod]:
    manifest = kro.ray_job(OWNER, spec, SETTINGS) if spec.entrypoint else kro.ray_cluster(OWNER, spec, SETTINGS)
    return {
        role: Pod(namespace or OWNER.namespace or "", t["metadata"]["labels"]) for role, t in pod_templates(manifest)
    }


def _policies(*specs: kro.RaySpec) -> list[dict[str, Any]]:
    objects = kro.ray_namespace_objects("vision", SETTINGS)
    for spec in specs:
        objects += kro.ray_objects(OWNER, spec, SETTINGS)
    return [o for o in objects if o["kind"] == "NetworkPolicy"]


def test_a_clusters_pods_reach_each_other_and_nothing_else_reaches_them() -> None:
    mine, other = ray(entrypoint="python tune.py"), ray(name="other")
    policies = _policies(mine, other)
    pods, others = _pods(mine), _pods(other)
    for target in pods.values():
        for source in pods.values():
            for port in (kro.GCS_PORT, kro.DASHBOARD_PORT, 12345):
                assert ingress_allowed(policies, source, target, port), (source, target, port)
        strangers = [
            *others.values(),  # another cluster of the same workspace, same namespace
            Pod(OWNER.namespace or ""),  # an unlabelled pod of the namespace
            Pod(ko.jobs_namespace_name("vision", SETTINGS), target.labels),  # the workspace's jobs, even labelled so
            Pod(ko.namespace_name(ko.Owner("vision", "dev"), SETTINGS)),  # its notebooks
            Pod(kro.ray_namespace_name("other", SETTINGS), target.labels),  # another workspace's Ray namespace
            Pod("kube-system"),
        ]
        for source in strangers:
            assert not ingress_allowed(policies, source, target, kro.GCS_PORT), (source, target)
            assert not ingress_allowed(policies, source, target, kro.DASHBOARD_PORT), (source, target)


def test_the_ingress_controller_and_kuberay_reach_the_head_dashboard_only() -> None:
    job, cluster = ray(entrypoint="python tune.py"), ray(name="lab")
    policies = _policies(job, cluster)
    controller = Pod(SETTINGS.ingress_namespace, {"app.kubernetes.io/name": "ingress-nginx"})
    operator = Pod(kro.DEFAULT_OPERATOR_NAMESPACE, dict(kro.OPERATOR_POD_LABELS))
    for spec in (job, cluster):
        pods = _pods(spec)
        assert ingress_allowed(policies, controller, pods["head"], kro.DASHBOARD_PORT)
        assert not ingress_allowed(policies, controller, pods["head"], kro.GCS_PORT)
        assert not ingress_allowed(policies, controller, pods["head"], kro.CLIENT_PORT)
        assert not ingress_allowed(policies, controller, pods["worker"], kro.DASHBOARD_PORT)
        # The operator polls a RayJob's Jobs API; a plain cluster's dashboard it has no need of.
        assert ingress_allowed(policies, operator, pods["head"], kro.DASHBOARD_PORT) is (spec is job)
        assert not ingress_allowed(policies, operator, pods["worker"], kro.DASHBOARD_PORT)
        look_alike = Pod("default", {"app.kubernetes.io/name": "ingress-nginx"})
        assert not ingress_allowed(policies, look_alike, pods["head"], kro.DASHBOARD_PORT)
    forged_operator = Pod(SETTINGS.ingress_namespace + "-x", dict(kro.OPERATOR_POD_LABELS))
    assert not ingress_allowed(policies, forged_operator, _pods(job)["head"], kro.DASHBOARD_PORT)
    assert not ingress_allowed(policies, Pod(kro.DEFAULT_OPERATOR_NAMESPACE), _pods(job)["head"], kro.DASHBOARD_PORT)


def test_a_workspaces_ray_namespace_is_its_own_and_restricted() -> None:
    namespace, deny_all = kro.ray_namespace_objects("vision", SETTINGS)
    name = namespace["metadata"]["name"]
    assert name == OWNER.namespace and name.startswith("gp-vision-ray-")
    assert name not in {
        ko.jobs_namespace_name("vision", SETTINGS),
        ko.namespace_name(ko.Owner("vision", "ray"), SETTINGS),
        kro.ray_namespace_name("other", SETTINGS),
    }
    for mode in ("enforce", "audit", "warn"):
        assert namespace["metadata"]["labels"][f"pod-security.kubernetes.io/{mode}"] == "restricted"
    assert deny_all["spec"] == {"podSelector": {}, "policyTypes": ["Ingress"]}
    assert not ingress_allowed([deny_all], Pod(name, {"a": "b"}), Pod(name, {"a": "b"}), 80)


# -- what KubeRay reports ---------------------------------------------------------------------------------------


def test_it_reads_readiness_and_outcomes_from_kuberays_status() -> None:
    assert kro.cluster_ready({"state": "ready", "readyWorkerReplicas": 2}, 2)
    assert not kro.cluster_ready({"state": "ready", "readyWorkerReplicas": 1}, 2)
    assert not kro.cluster_ready({"readyWorkerReplicas": 2}, 2) and not kro.cluster_ready(None, 0)

    def outcome(**status: Any) -> tuple[int, str] | None:
        return kro.job_outcome({"status": status})

    assert outcome(jobDeploymentStatus="Running", jobStatus="RUNNING") is None
    assert outcome(jobDeploymentStatus="Complete", jobStatus="SUCCEEDED") == (0, "exited")
    assert outcome(jobDeploymentStatus="Complete", jobStatus="STOPPED") == (143, "the Ray job was stopped")
    failed = outcome(jobDeploymentStatus="Failed", jobStatus="FAILED", reason="AppFailed", message="boom")
    assert failed == (1, "the Ray job failed: boom")
    late = outcome(jobDeploymentStatus="Failed", jobStatus="RUNNING", reason="DeadlineExceeded")
    assert late is not None and late[0] == TIMEOUT_EXIT_CODE
    never = outcome(jobDeploymentStatus="Failed", reason="SubmissionFailed", message="submitter failed")
    assert never == (UNKNOWN_EXIT_CODE, "the RayJob failed: submitter failed")


def test_a_failed_ray_jobs_exit_code_is_its_entrypoints() -> None:
    # KubeRay v1.7.0 has no field for it, but copies the Ray job's message into the RayJob's status.message.
    def failed(message: str) -> tuple[int, str] | None:
        status = {"jobDeploymentStatus": "Failed", "jobStatus": "FAILED", "reason": "AppFailed", "message": message}
        return kro.job_outcome({"status": status})

    logs = (
        "Job entrypoint command failed with exit code 3, last available logs (truncated to 20,000 chars):\nexit code 7"
    )
    assert failed(logs) == (3, "the Ray job's entrypoint exited with code 3")
    assert failed("Job entrypoint command failed with exit code 42. No logs available.") == (
        42,
        "the Ray job's entrypoint exited with code 42",
    )
    killed = failed("Job entrypoint command failed with exit code -9. No logs available.")  # SIGKILL, as a shell says
    assert killed is not None and killed[0] == 137
    # Where the entrypoint never ran or the job was lost, no code of its own: 1.
    assert failed("Traceback (most recent call last):\n  ...") == (
        1,
        "the Ray job failed: Traceback (most recent call last):\n  ...",
    )
    lost = failed("Submitter completed but Ray job not found in RayCluster.")
    assert lost is not None and lost[0] == 1
    assert failed("The entrypoint said: Job entrypoint command failed with exit code 5.") == (
        1,
        "the Ray job failed: The entrypoint said: Job entrypoint command failed with exit code 5.",
    )


def _ray_failure_messages() -> list[ast.expr]:
    """The messages the pinned Ray's job supervisor writes when an entrypoint exits non-zero, as expressions of its
    source (``message = ...`` where it names the entrypoint's ``return_code``)."""
    from ray.dashboard.modules.job import job_supervisor

    tree = ast.parse(inspect.getsource(job_supervisor))
    return [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign)
        and [getattr(t, "id", None) for t in node.targets] == ["message"]
        and any(isinstance(n, ast.Name) and n.id == "return_code" for n in ast.walk(node.value))
    ]


def test_the_exit_code_is_read_from_the_message_the_pinned_ray_writes() -> None:
    messages = _ray_failure_messages()
    assert len(messages) == 2  # with the tail of the log, and without
    for expression in messages:
        for code, expected in ((3, 3), (255, 255), (-15, 143)):
            text = eval(
                compile(ast.Expression(expression), "job_supervisor", "eval"),
                {},
                {"return_code": code, "log_tail": "x"},
            )
            assert kro.entrypoint_exit_code(text) == expected, text


# -- the flow, through the official client, against the API emulator --------------------------------------------


@pytest.fixture
def cluster() -> Iterator[Emulator]:
    with running_emulator() as emulator:
        yield emulator


def backend(cluster: Emulator, **options: Any) -> KubernetesBackend:
    options = {"start_timeout_s": 5.0, "stop_timeout_s": 5.0, "poll_interval_s": 0.01, **options}
    return KubernetesBackend(settings=SETTINGS, host=cluster.url, **options)


def ray_spec(entrypoint: str = "", workers: int = 2, **overrides: Any) -> RayClusterSpec:
    fields: dict[str, Any] = {
        "key": "ray-5",
        "workspace": "vision",
        "name": "tune",
        "work_dir": "/unused",
        "auth_token": TOKEN,
        "head": NodeGroup("head", cpu_cores=4, memory_gb=16, gpus=1, gpu_type="h100"),
        "workers": NodeGroup("worker", replicas=workers, cpu_cores=8, memory_gb=64, gpus=2, gpu_type="h100"),
        "entrypoint": entrypoint,
        "env": {"EPOCHS": "3"},
        "portal_env": PORTAL_ENV,
    }
    return RayClusterSpec(**(fields | overrides))


NS = kro.ray_namespace_name("vision", SETTINGS)
NAME = kro.cluster_name("ray-5")
RAYCLUSTER = f"/apis/ray.io/v1/namespaces/{NS}/rayclusters/{NAME}"
RAYJOB = f"/apis/ray.io/v1/namespaces/{NS}/rayjobs/{NAME}"
SECRET = f"/api/v1/namespaces/{NS}/secrets/{kro.auth_secret_name('ray-5')}"
POLICIES = f"/apis/networking.k8s.io/v1/namespaces/{NS}/networkpolicies"
DASHBOARD = f"http://{NAME}-head-svc.{NS}.svc:8265"


def kuberay(cluster: Emulator, path: str, status: dict[str, Any]) -> Any:
    """The operator's part: once the object exists, it writes ``status``."""
    return cluster.when(path, lambda obj: True, lambda: cluster.set_status(path, status))


READY = {"state": "ready", "readyWorkerReplicas": 2, "desiredWorkerReplicas": 2}


def test_a_ray_cluster_starts_once_kuberay_reports_it_ready_and_stops(cluster: Emulator) -> None:
    k8s = backend(cluster)
    operator = kuberay(cluster, RAYCLUSTER, READY)
    endpoint = k8s.start(ray_spec())
    operator.join()
    assert (endpoint.host, endpoint.port, endpoint.url) == (f"{NAME}-head-svc.{NS}.svc", 8265, DASHBOARD)
    stored = cluster.get(RAYCLUSTER)
    assert stored is not None
    assert kuberay_fields.problems({k: v for k, v in stored.items() if k != "status"}) == []
    assert stored["spec"]["workerGroupSpecs"][0]["replicas"] == 2
    secret = cluster.get(SECRET)
    assert secret is not None and secret["stringData"][kro.AUTH_TOKEN_KEY] == TOKEN
    namespace = cluster.get(f"/api/v1/namespaces/{NS}")
    assert (
        namespace is not None and namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    )
    for policy in (ko.NETWORK_POLICY_ISOLATE, NAME, f"{NAME}-dashboard"):
        assert cluster.get(f"{POLICIES}/{policy}") is not None, policy
    assert k8s.poll() == Status("running", message="ready")

    # Again, and from a worker without the state: every create is a 409, the objects converge, same endpoint.
    assert k8s.start(ray_spec()) == endpoint
    assert backend(cluster).start(ray_spec()) == endpoint
    assert cluster.requests_to("post", f"/apis/ray.io/v1/namespaces/{NS}/rayclusters") == 3

    saved = k8s.get_state()
    k8s.stop()
    for path in (RAYCLUSTER, SECRET, f"{POLICIES}/{NAME}", f"{POLICIES}/{NAME}-dashboard"):
        assert cluster.get(path) is None, path
    assert cluster.get(f"{POLICIES}/{ko.NETWORK_POLICY_ISOLATE}") is not None  # the namespace's stays, closed
    assert k8s.poll() == Status("exited", 0, "stopped on request")
    reattached = backend(cluster)
    reattached.load_state(saved)
    reattached.stop()
    assert cluster.requests_to("delete", RAYCLUSTER) == 2


def test_it_waits_for_every_worker_and_deletes_a_cluster_that_never_gets_there(cluster: Emulator) -> None:
    operator = kuberay(cluster, RAYCLUSTER, READY | {"readyWorkerReplicas": 1})
    k8s = backend(cluster, start_timeout_s=0.5)
    with pytest.raises(BackendError) as late:
        k8s.start(ray_spec())
    operator.join()
    assert not late.value.permanent and "not ready" in late.value.message
    assert cluster.get(RAYCLUSTER) is None and cluster.get(SECRET) is None
    assert k8s.poll().state == "exited"


def test_a_ray_cluster_deleted_outside_the_portal_has_exited(cluster: Emulator) -> None:
    k8s = backend(cluster)
    operator = kuberay(cluster, RAYCLUSTER, READY)
    k8s.start(ray_spec())
    operator.join()
    cluster.delete(RAYCLUSTER)
    assert k8s.poll() == Status("exited", UNKNOWN_EXIT_CODE, "the RayCluster was deleted before its end was seen")


def test_an_entrypoint_runs_as_a_ray_job_whose_end_is_the_clusters(cluster: Emulator) -> None:
    k8s = backend(cluster)
    operator = kuberay(cluster, RAYJOB, {"jobDeploymentStatus": "Initializing", "rayClusterStatus": READY})
    endpoint = k8s.start(ray_spec(entrypoint="python tune.py", max_runtime_s=599.5))
    operator.join()
    assert endpoint.url == DASHBOARD
    stored = cluster.get(RAYJOB)
    assert stored is not None and cluster.get(RAYCLUSTER) is None
    assert kuberay_fields.problems({k: v for k, v in stored.items() if k != "status"}) == []
    assert stored["spec"]["entrypoint"] == kro.job_entrypoint("python tune.py")
    assert stored["spec"]["shutdownAfterJobFinishes"] is True and stored["spec"]["activeDeadlineSeconds"] == 600
    assert k8s.poll() == Status("running", message="ready")
    cluster.set_status(RAYJOB, {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING"})
    assert k8s.poll().running

    reattached = backend(cluster)
    reattached.load_state(k8s.get_state())
    cluster.set_status(RAYJOB, {"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED"})
    assert reattached.poll() == Status("exited", 0, "exited")
    # The cluster's Secret and policies go; the RayJob stays, with its submitter's log.
    assert cluster.get(SECRET) is None and cluster.get(f"{POLICIES}/{NAME}") is None
    assert cluster.get(RAYJOB) is not None
    assert reattached.poll() == Status("exited", 0, "exited")


@pytest.mark.parametrize(
    ("status", "code"),
    [
        ({"jobDeploymentStatus": "Failed", "jobStatus": "FAILED", "reason": "AppFailed"}, 1),
        (
            {
                "jobDeploymentStatus": "Failed",
                "jobStatus": "FAILED",
                "reason": "AppFailed",
                "message": "Job entrypoint command failed with exit code 3. No logs available.",
            },
            3,
        ),
        ({"jobDeploymentStatus": "Failed", "jobStatus": "RUNNING", "reason": "DeadlineExceeded"}, 124),
        ({"jobDeploymentStatus": "Failed", "reason": "SubmissionFailed"}, 255),
    ],
)
def test_a_failed_ray_job_reports_why(cluster: Emulator, status: dict[str, Any], code: int) -> None:
    k8s = backend(cluster)
    operator = kuberay(cluster, RAYJOB, status)
    k8s.start(ray_spec(entrypoint="python tune.py"))  # already over: the start returns, poll says how it ended
    operator.join()
    assert k8s.poll().exit_code == code


def test_stopping_a_ray_job_cuts_it_short(cluster: Emulator) -> None:
    k8s = backend(cluster)
    operator = kuberay(cluster, RAYJOB, {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING"})
    k8s.start(ray_spec(entrypoint="python tune.py"))
    operator.join()
    k8s.stop()
    assert cluster.get(RAYJOB) is None and cluster.get(SECRET) is None
    assert k8s.poll() == Status("exited", 143, "stopped on request")


def test_a_finished_ray_job_of_an_earlier_run_is_removed_before_a_new_start(cluster: Emulator) -> None:
    done = {"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED"}
    operator = kuberay(cluster, RAYJOB, done)
    first = backend(cluster)
    first.start(ray_spec(entrypoint="python tune.py"))
    operator.join()
    # The same backend starting again keeps what it ran; a new start under the name removes it.
    assert first.start(ray_spec(entrypoint="python tune.py")).url == DASHBOARD
    with pytest.raises(BackendError) as retry:
        backend(cluster).start(ray_spec(entrypoint="python tune.py"))
    assert not retry.value.permanent
    assert cluster.get(RAYJOB) is None


def _ended(seconds_ago: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - seconds_ago))


def test_a_finished_ray_job_is_deleted_as_long_after_its_end_as_a_finished_job(cluster: Emulator) -> None:
    k8s = backend(cluster)
    operator = kuberay(cluster, RAYJOB, {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING"})
    k8s.start(ray_spec(entrypoint="python tune.py"))
    operator.join()
    ttl = SETTINGS.job_ttl_after_finished_s  # what a finished Job gets (ttlSecondsAfterFinished)
    ended = {"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED", "endTime": _ended(ttl - 60)}
    cluster.set_status(RAYJOB, ended)
    assert k8s.poll() == Status("exited", 0, "exited")
    # KubeRay keeps it (and its submitter's Job and pod) for good; the sweep deletes it once its TTL is over.
    assert backend(cluster).sweep_orphans("/unused") == []
    assert cluster.get(RAYJOB) is not None  # its output can still be read
    cluster.set_status(RAYJOB, {"endTime": _ended(ttl + 1)})
    assert backend(cluster).sweep_orphans("/unused") == [f"{NS}/{NAME}"]
    assert cluster.get(RAYJOB) is None


def test_the_sweep_leaves_running_recent_recorded_starting_and_other_ray_jobs(cluster: Emulator) -> None:
    assert backend(cluster).sweep_orphans("/unused") == []  # no RayJob yet: the API server knows none
    collection = f"/apis/ray.io/v1/namespaces/{NS}/rayjobs"
    long_ago = {"jobDeploymentStatus": "Failed", "jobStatus": "FAILED", "endTime": _ended(3600 + 60)}
    statuses = {
        "old": long_ago,  # the only one to go
        "running": {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING"},
        "recent": long_ago | {"endTime": _ended(60)},
        "recorded": long_ago,  # a live workload's state names it
        "starting": long_ago,  # named after the key of a workload being started
        "no-end": {"jobDeploymentStatus": "Failed"},  # KubeRay did not say when it ended
    }
    for name, status in statuses.items():
        cluster.post(collection, kro.ray_job(OWNER, ray(name=name, entrypoint="x"), SETTINGS) | {"status": status})
    theirs = {"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": {"name": "theirs", "namespace": NS}}
    cluster.post(collection, theirs | {"status": long_ago})
    elsewhere = ko.jobs_namespace_name("vision", SETTINGS)  # labelled as the portal's, not in a Ray namespace
    stray = kro.ray_job(OWNER, ray(name="stray", entrypoint="x"), SETTINGS)
    stray["metadata"]["namespace"] = elsewhere
    cluster.post(f"/apis/ray.io/v1/namespaces/{elsewhere}/rayjobs", stray | {"status": long_ago})
    recorded = {
        "kind": "ray",
        "namespace": NS,
        "objects": [{"kind": "RayJob", "name": "ray-recorded", "namespace": NS}],
    }

    swept = backend(cluster).sweep_orphans("/unused", Keep(states=(recorded,), keys=frozenset({"starting"})))

    assert swept == [f"{NS}/ray-old"]
    left = {name for name in [*statuses, "theirs"] if cluster.get(f"{collection}/{kro.cluster_name(name)}")}
    assert left == set(statuses) - {"old"} and cluster.get(f"{collection}/theirs") is not None
    assert cluster.get(f"/apis/ray.io/v1/namespaces/{elsewhere}/rayjobs/ray-stray") is not None


def _pod(role: str, name: str, created: str = "2026-01-01T00:00:00Z") -> dict[str, Any]:
    labels = kro.cluster_labels(OWNER, "ray-5", role) | {"ray.io/cluster": NAME}
    return {"metadata": {"name": name, "namespace": NS, "labels": labels, "creationTimestamp": created}}


def test_it_reads_the_ray_jobs_output_and_progress_from_its_submitter_and_the_nodes_logs(cluster: Emulator) -> None:
    k8s = backend(cluster)
    operator = kuberay(cluster, RAYJOB, {"jobDeploymentStatus": "Running"})
    k8s.start(ray_spec(entrypoint="python tune.py"))
    operator.join()
    assert k8s.logs(0) == (b"", 0) and k8s.progress() is None  # no pod yet
    pods = f"/api/v1/namespaces/{NS}/pods"
    cluster.post(pods, _pod("submitter", f"{NAME}-old", "2026-01-01T00:00:00Z"))
    cluster.post(pods, _pod("submitter", f"{NAME}-new", "2026-01-01T00:01:00Z"))
    cluster.post(pods, _pod("head", f"{NAME}-abcde-head-x"))
    for index in (1, 0):
        cluster.post(pods, _pod("worker", f"{NAME}-abcde-workers-worker-{index}"))
    output = b"trial 1\nPROGRESS 0.25\nPROGRESS 0.5\n"
    cluster.respond(f"get {pods}/{NAME}-new/log", output)
    cluster.respond(f"get {pods}/{NAME}-abcde-workers-worker-1/log", b"worker 1\n")
    assert k8s.logs(0) == (output, len(output))
    progress = k8s.progress()
    assert progress is not None and progress.fraction == 0.5
    assert k8s.logs(2) == (b"worker 1\n", 9)
    with pytest.raises(BackendError) as missing:
        k8s.logs(3)
    assert missing.value.permanent


def test_the_stored_pods_are_restricted_and_closed_to_other_tenants(cluster: Emulator) -> None:
    k8s = backend(cluster)
    operator = kuberay(cluster, RAYJOB, {"jobDeploymentStatus": "Running"})
    k8s.start(ray_spec(entrypoint="python tune.py"))
    operator.join()
    stored = cluster.get(RAYJOB)
    assert stored is not None
    policies = [cluster.get(f"{POLICIES}/{p}") for p in (ko.NETWORK_POLICY_ISOLATE, NAME, f"{NAME}-dashboard")]
    assert all(p is not None for p in policies)
    templates = dict(pod_templates(stored))
    for template in templates.values():
        assert restricted_violations(template["spec"]) == []
    head = Pod(NS, templates["head"]["metadata"]["labels"])
    worker = Pod(NS, templates["worker"]["metadata"]["labels"])
    assert ingress_allowed([p for p in policies if p], worker, head, kro.GCS_PORT)
    other = Pod(kro.ray_namespace_name("other", SETTINGS), templates["head"]["metadata"]["labels"])
    assert not ingress_allowed([p for p in policies if p], other, head, kro.GCS_PORT)


def test_it_refuses_env_that_would_turn_authentication_off(cluster: Emulator) -> None:
    with pytest.raises(PolicyRefusal, match="RAY_AUTH_MODE"):
        backend(cluster).start(ray_spec(env={"RAY_AUTH_MODE": "disabled"}))
    assert cluster.get(RAYCLUSTER) is None


def test_an_invalid_ray_cluster_is_a_permanent_error_and_a_server_error_transient(cluster: Emulator) -> None:
    collection = f"post /apis/ray.io/v1/namespaces/{NS}/rayclusters"
    status = {"kind": "Status", "status": "Failure", "reason": "Invalid", "code": 422, "message": "spec: Invalid"}
    cluster.respond(collection, 422, status)
    with pytest.raises(BackendError) as invalid:
        backend(cluster).start(ray_spec())
    assert invalid.value.permanent and "spec: Invalid" in invalid.value.message


def test_a_ray_cluster_that_is_not_the_portals_is_left_alone(cluster: Emulator) -> None:
    cluster.post("/api/v1/namespaces", {"metadata": {"name": NS, "labels": ko.portal_labels(OWNER, "namespace", "")}})
    theirs = {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": NAME, "namespace": NS}}
    cluster.post(f"/apis/ray.io/v1/namespaces/{NS}/rayclusters", theirs)
    with pytest.raises(BackendError) as refused:
        backend(cluster).start(ray_spec())
    assert refused.value.permanent
    assert cluster.get(RAYCLUSTER) == theirs


def test_a_token_is_required() -> None:
    with pytest.raises(BackendError) as refused:
        KubernetesBackend(host="http://127.0.0.1:9").start(ray_spec(auth_token=""))
    assert refused.value.permanent


def test_the_registry_configures_the_ray_image_and_the_operators_namespace() -> None:
    connection = {"default_ray_image": "rayproject/ray:2.60.0-py312-gpu", "kuberay_operator_namespace": "ray-system"}
    k8s = backend_for(SimpleNamespace(kind="kubernetes", connection=connection))
    assert isinstance(k8s, KubernetesBackend)
    assert k8s.default_ray_image == "rayproject/ray:2.60.0-py312-gpu" and k8s.kuberay_operator_namespace == "ray-system"
    with pytest.raises(BackendError) as refused:
        backend_for(SimpleNamespace(kind="kubernetes", connection={"kuberay_operator_namespace": "Ray System"}))
    assert refused.value.permanent and "kuberay_operator_namespace" in refused.value.message
