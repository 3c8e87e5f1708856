"""The Kubernetes backend's manifests: every one validated against the Kubernetes 1.37 schemas (strict: no
unknown fields), plus what schemas cannot see (names, gang wiring, quotas, isolation)."""

from __future__ import annotations

import copy
import json
import re
from decimal import Decimal
from typing import Any

import kubernetes_validate
import pytest

from workers.backends import kubernetes_objects as ko
from workers.backends import kubernetes_vcluster as kv

K8S_VERSION = "1.37.0"
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
LONG = "x" * 40 + "-" + "y" * 22  # a 63-character DNS label

OWNER = ko.Owner(workspace="vision", instance="dev")
LONG_OWNER = ko.Owner(workspace=LONG, instance=LONG)
PROFILE = ko.Size(cpu_cores=32, memory_gb=256, gpus=Decimal(8), gpu_type="h100")
NO_GPU_PROFILE = ko.Size(cpu_cores=4, memory_gb=16)
WHOLE = ko.Size(cpu_cores=8, memory_gb=64, gpus=Decimal(2), gpu_type="h100")
NO_GPU = ko.Size(cpu_cores=2, memory_gb=4)
SHARED = ko.KubeSettings(fractional_gpu_resource_name="nvidia.com/gpu.shared", gpu_type_node_label="gpuportal.io/gpu")
HOST = ko.KubeSettings(ingress_mode="host", ingress_host="nb.example.org", ingress_tls_secret="wildcard-nb")
PATH = ko.KubeSettings(ingress_mode="path", ingress_host="portal.example.org")


PORTAL_ENV = {
    "GPUPORTAL_URL": "https://portal.example.org",
    "GPUPORTAL_WORKSPACE": "vision",
    "GPUPORTAL_TOKEN": "gpw_job_7_" + "ab" * 32,
}


def _job(name: str = "train", replicas: int = 4, size: ko.Size = WHOLE, **kwargs: Any) -> ko.GangJob:
    return ko.GangJob(
        name=name, image="pytorch/pytorch:2.5.1", command="python train.py", size=size, replicas=replicas, **kwargs
    )


def every_manifest() -> list[tuple[str, dict[str, Any]]]:
    """Each builder over kinds, ingress modes, with and without GPUs, gangs of 1 and 4, short and long names."""
    cases: list[tuple[str, dict[str, Any]]] = []
    for owner_id, owner in [("short", OWNER), ("long", LONG_OWNER)]:
        for profile_id, profile in [
            ("gpus", PROFILE),
            ("nogpu", NO_GPU_PROFILE),
            ("half", ko.Size(4, 16, Decimal("0.5"))),
        ]:
            settings = SHARED if profile_id == "half" else ko.KubeSettings()
            for obj in ko.namespace_objects(owner, profile, ["alice", "bob"], settings):
                cases.append((f"namespace-{owner_id}-{profile_id}-{obj['kind']}", obj))
            for obj in kv.vcluster_objects(owner, profile, settings, api_server_url="https://vc.example.org"):
                cases.append((f"vcluster-{owner_id}-{profile_id}-{obj['kind']}-{obj['metadata']['name']}", obj))
        for settings_id, settings in [("host", HOST), ("path", PATH), ("pathnohost", ko.KubeSettings())]:
            for nb in ["lab", LONG, "1st"]:
                for size_id, size in [("gpus", WHOLE), ("nogpu", NO_GPU)]:
                    objs = ko.notebook_objects(
                        owner, nb, image="quay.io/jupyter/minimal-notebook", size=size, token="t0k", settings=settings
                    )
                    cases += [(f"notebook-{owner_id}-{settings_id}-{len(nb)}-{size_id}-{o['kind']}", o) for o in objs]
        for name in ["train", LONG, "7b"]:
            for replicas in [1, 4]:
                for size_id, size in [("gpus", WHOLE), ("nogpu", NO_GPU)]:
                    spec = _job(name, replicas, size, env={"EPOCHS": "3"}, max_runtime_s=3600)
                    objs = ko.job_objects(owner, spec, SHARED)
                    cases += [(f"job-{owner_id}-{len(name)}-{replicas}-{size_id}-{o['kind']}", o) for o in objs]
        cases.append((f"job-{owner_id}-fractional", ko.job(owner, _job(size=ko.Size(2, 8, Decimal("0.25"))), SHARED)))
        jobs_owner = ko.jobs_owner(owner.workspace, SHARED)
        cases += [
            (f"jobs-namespace-{owner_id}-{o['kind']}", o) for o in ko.jobs_namespace_objects(owner.workspace, SHARED)
        ]
        cases += [
            (f"job-in-jobs-namespace-{owner_id}-{o['kind']}", o) for o in ko.job_objects(jobs_owner, _job(), SHARED)
        ]
        in_namespace = ko.Owner(owner.workspace, owner.instance, namespace=ko.namespace_name(owner, SHARED))
        objs = ko.notebook_objects(
            in_namespace, "lab", image="img", size=WHOLE, token="t", settings=HOST, base_url="/nb/vision/lab/"
        )
        cases += [(f"notebook-base-url-{owner_id}-{o['kind']}", o) for o in objs]
        with_token = ko.notebook_objects(
            owner, "lab", image="img", size=NO_GPU, token="t", settings=PATH, service_account=ko.service_account_name()
        )
        cases += [(f"notebook-with-token-{owner_id}-{o['kind']}", o) for o in with_token]
        asks = _job(service_account="default")
        cases += [(f"job-with-token-{owner_id}-{o['kind']}", o) for o in ko.job_objects(jobs_owner, asks, SHARED)]
        sdk = _job(env={"GPUPORTAL_TOKEN": "mine"}, portal_env=PORTAL_ENV)
        cases += [(f"job-with-portal-env-{owner_id}-{o['kind']}", o) for o in ko.job_objects(jobs_owner, sdk, SHARED)]
        with_portal_env = ko.notebook_objects(
            owner, "lab", image="img", size=NO_GPU, token="t", settings=HOST, portal_env=PORTAL_ENV
        )
        cases += [(f"notebook-with-portal-env-{owner_id}-{o['kind']}", o) for o in with_portal_env]
        ids = ko.KubeSettings(pod_run_as_user=4242, pod_run_as_group=4343, pod_fs_group=4444)
        cases += [(f"ids-{owner_id}-{o['kind']}", o) for o in ko.namespace_objects(owner, PROFILE, ["alice"], ids)]
        cases.append((f"ids-job-{owner_id}", ko.job(owner, _job(), ids)))
        small = ko.Size(cpu_cores=0.5, memory_gb=0.75)
        cases += [(f"small-{owner_id}-{o['kind']}", o) for o in ko.namespace_objects(owner, small, [], SHARED)]
        cases.append((f"small-job-{owner_id}", ko.job(owner, _job(size=small), SHARED)))
    released = ko.job(OWNER, _job(), SHARED)
    released["spec"].update(ko.job_release_patch()["spec"])
    cases.append(("job-released", released))
    return cases


CASES = every_manifest()


@pytest.mark.parametrize("manifest", [m for _, m in CASES], ids=[i for i, _ in CASES])
def test_it_is_valid_against_the_kubernetes_schema(manifest: dict[str, Any]) -> None:
    kubernetes_validate.validate(manifest, K8S_VERSION, strict=True)


@pytest.mark.parametrize("manifest", [m for _, m in CASES], ids=[i for i, _ in CASES])
def test_it_has_valid_names_and_the_portal_labels(manifest: dict[str, Any]) -> None:
    # What the schemas do not check and the API server would.
    meta = manifest["metadata"]
    pattern = DNS_1035 if manifest["kind"] == "Service" else DNS_LABEL
    assert pattern.match(meta["name"]), meta["name"]
    if "namespace" in meta:
        assert DNS_LABEL.match(meta["namespace"])
    assert set(meta["labels"]) >= {
        "app.kubernetes.io/managed-by",
        ko.LABEL_WORKSPACE,
        ko.LABEL_INSTANCE,
        ko.LABEL_COMPONENT,
        ko.LABEL_NAME,
    }
    assert all(len(value) <= 63 for value in meta["labels"].values())
    template = manifest.get("spec", {}).get("template")
    if template:
        assert template["metadata"]["labels"] == {k: v for k, v in meta["labels"].items()}


def test_the_invalid_manifest_is_caught() -> None:
    # The check above is not vacuous: a misspelt field fails strict validation.
    bad = ko.job(OWNER, _job(), ko.KubeSettings())
    bad["spec"]["completionsMode"] = bad["spec"].pop("completionMode")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, K8S_VERSION, strict=True)


# -- jobs -------------------------------------------------------------------------------------------------


def _env(manifest: dict[str, Any]) -> dict[str, Any]:
    container = manifest["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def test_it_creates_the_job_suspended_and_the_patch_releases_it() -> None:
    manifest = ko.job(OWNER, _job(replicas=4), ko.KubeSettings())
    spec = manifest["spec"]
    assert spec["suspend"] is True
    assert spec["completionMode"] == "Indexed"
    assert spec["completions"] == spec["parallelism"] == 4
    assert spec["backoffLimit"] == 0
    assert spec["template"]["spec"]["restartPolicy"] == "Never"
    patch = ko.job_release_patch()
    assert patch == {"spec": {"suspend": False}}
    released = copy.deepcopy(manifest)
    released["spec"].update(patch["spec"])
    assert released["spec"]["suspend"] is False
    assert {k: v for k, v in released["spec"].items() if k != "suspend"} == {
        k: v for k, v in spec.items() if k != "suspend"
    }


@pytest.mark.parametrize("replicas", [1, 4])
def test_it_wires_the_gang_rank_world_size_and_master(replicas: int) -> None:
    settings = ko.KubeSettings(master_port=23456)
    service, manifest = ko.job_objects(OWNER, _job(replicas=replicas), settings)
    env = _env(manifest)
    name = manifest["metadata"]["name"]
    assert env["RANK"] == {"fieldRef": {"fieldPath": f"metadata.annotations['{ko.JOB_INDEX_ANNOTATION}']"}}
    assert env["WORLD_SIZE"] == str(replicas) == str(manifest["spec"]["completions"])
    # Rank 0's pod is "<job>-0", reachable as "<job>-0.<subdomain>", the subdomain being the headless Service.
    pod_spec = manifest["spec"]["template"]["spec"]
    assert pod_spec["subdomain"] == service["metadata"]["name"]
    assert env["MASTER_ADDR"] == f"{name}-0.{service['metadata']['name']}"
    assert env["MASTER_PORT"] == "23456"
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True
    assert service["spec"]["selector"].items() <= manifest["spec"]["template"]["metadata"]["labels"].items()


def test_it_passes_the_users_env_and_refuses_to_let_it_override_the_gang() -> None:
    env = _env(ko.job(OWNER, _job(env={"EPOCHS": "3", "LR": "0.1"}), ko.KubeSettings()))
    assert env["EPOCHS"] == "3" and env["LR"] == "0.1"
    with pytest.raises(ko.UnsupportedRequest, match="RANK"):
        ko.job(OWNER, _job(env={"RANK": "0"}), ko.KubeSettings())


def test_it_limits_gpus_per_replica_and_runtime() -> None:
    manifest = ko.job(OWNER, _job(replicas=4, max_runtime_s=7200), ko.KubeSettings())
    resources = manifest["spec"]["template"]["spec"]["containers"][0]["resources"]
    assert resources["limits"] == {"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": "2"}
    assert resources["requests"] == {"cpu": "8", "memory": "64Gi"}
    assert manifest["spec"]["activeDeadlineSeconds"] == 7200
    assert manifest["spec"]["ttlSecondsAfterFinished"] == 3600
    unbounded = ko.job(OWNER, _job(size=NO_GPU), ko.KubeSettings())
    assert "activeDeadlineSeconds" not in unbounded["spec"]
    assert "nvidia.com/gpu" not in unbounded["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]


def test_it_asks_for_gpu_shares_only_where_the_cluster_has_them() -> None:
    quarter = _job(size=ko.Size(2, 8, Decimal("0.25"), gpu_type="a100"))
    with pytest.raises(ko.UnsupportedRequest, match="time-slicing or MIG"):
        ko.job(OWNER, quarter, ko.KubeSettings())
    pod = ko.job(OWNER, quarter, SHARED)["spec"]["template"]["spec"]
    assert pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu.shared"] == "1"
    assert pod["nodeSelector"] == {"gpuportal.io/gpu": "a100"}


# -- names ------------------------------------------------------------------------------------------------


def test_it_shortens_long_names_deterministically_and_keeps_them_unique() -> None:
    other = LONG[:-1] + "z"
    names = {ko.job_name(LONG), ko.job_name(other), ko.notebook_name(LONG), ko.notebook_name(other)}
    assert len(names) == 4
    assert ko.job_name(LONG) == ko.job_name(LONG)
    assert all(DNS_LABEL.match(n) for n in names)
    assert len(ko.job_name(LONG)) <= 58  # room for "-<index>" in the pods' hostnames
    assert ko.job_name("train") == "job-train"  # short names are kept readable
    a = ko.namespace_name(LONG_OWNER, ko.KubeSettings())
    b = ko.namespace_name(ko.Owner(LONG, other), ko.KubeSettings())
    assert a != b and len(a) <= 63 and a == ko.namespace_name(LONG_OWNER, ko.KubeSettings())


def test_it_gives_workspaces_whose_names_join_alike_different_namespaces() -> None:
    settings = ko.KubeSettings()
    a = ko.namespace_name(ko.Owner("team-a", "dev"), settings)
    b = ko.namespace_name(ko.Owner("team", "a-dev"), settings)
    assert a != b
    assert a.startswith("gp-team-a-dev-")


# -- namespaces -------------------------------------------------------------------------------------------


def test_the_quota_matches_the_profile() -> None:
    quota = ko.resource_quota(OWNER, PROFILE, ko.KubeSettings(max_pods_per_namespace=40))
    assert quota["spec"]["hard"] == {
        "requests.cpu": "32",
        "limits.cpu": "32",
        "requests.memory": "256Gi",
        "limits.memory": "256Gi",
        "requests.nvidia.com/gpu": "8",
        "pods": "40",
    }
    no_gpus = ko.resource_quota(OWNER, NO_GPU_PROFILE, ko.KubeSettings())["spec"]["hard"]
    assert no_gpus["requests.nvidia.com/gpu"] == "0"
    half = ko.resource_quota(OWNER, ko.Size(4, 16, Decimal("0.5")), SHARED)["spec"]["hard"]
    assert half["requests.nvidia.com/gpu.shared"] == "2"
    assert half["requests.nvidia.com/gpu"] == "0"


def test_a_namespace_without_gpus_can_ask_for_no_kind_of_gpu() -> None:
    settings = ko.KubeSettings(
        fractional_gpu_resource_name="nvidia.com/gpu.shared",
        gpu_type_resources={"a100-1g-10gb": "nvidia.com/mig-1g.10gb"},
    )
    hard = ko.resource_quota(OWNER, NO_GPU_PROFILE, settings)["spec"]["hard"]
    assert {k: v for k, v in hard.items() if "nvidia.com" in k} == {
        "requests.nvidia.com/gpu": "0",
        "requests.nvidia.com/gpu.shared": "0",
        "requests.nvidia.com/mig-1g.10gb": "0",
    }


def test_the_limit_range_stays_within_the_profile() -> None:
    item = ko.limit_range(OWNER, ko.Size(cpu_cores=1, memory_gb=1), ko.KubeSettings())["spec"]["limits"][0]
    assert item["type"] == "Container"
    assert item["max"] == {"cpu": "1", "memory": "1Gi"}
    assert item["default"] == {"cpu": "1", "memory": "1Gi"}
    assert item["defaultRequest"] == {"cpu": "250m", "memory": "512Mi"}


def test_the_namespace_carries_its_owner_and_the_restricted_pod_security_labels() -> None:
    # Every rule of the profile, and every namespace's labels, are checked in test_kubernetes_isolation.py.
    labels = ko.namespace(OWNER, ko.KubeSettings())["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    assert labels[ko.LABEL_WORKSPACE] == "vision" and labels[ko.LABEL_INSTANCE] == "dev"


def test_the_role_binding_gives_the_workspaces_users_edit() -> None:
    binding = ko.role_binding(OWNER, ["bob", "alice", "bob"], ko.KubeSettings(username_prefix="oidc:"))
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"}
    users = [s["name"] for s in binding["subjects"] if s["kind"] == "User"]
    assert users == ["oidc:alice", "oidc:bob"]
    accounts = [s for s in binding["subjects"] if s["kind"] == "ServiceAccount"]
    assert accounts == [
        {"kind": "ServiceAccount", "name": "gpuportal-user", "namespace": binding["metadata"]["namespace"]}
    ]


def test_the_network_policies_select_what_they_should() -> None:
    # What they admit is evaluated rule by rule in test_kubernetes_isolation.py; here, their shape.
    settings = ko.KubeSettings(ingress_namespace="ingress-nginx")
    isolate = ko.network_policy(OWNER, settings)
    assert isolate["spec"] == {
        "podSelector": {},
        "policyTypes": ["Ingress"],
        "ingress": [{"from": [{"podSelector": {}}]}],
    }
    notebooks = ko.notebook_ingress_network_policy(OWNER, settings)["spec"]
    assert notebooks["podSelector"]["matchLabels"][ko.LABEL_COMPONENT] == "notebook"
    (rule,) = notebooks["ingress"]
    assert rule["from"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ingress-nginx"}}}]
    assert rule["ports"] == [{"protocol": "TCP", "port": ko.JUPYTER_PORT}]
    kinds = [(o["kind"], o["metadata"]["name"]) for o in ko.namespace_objects(OWNER, PROFILE, [], settings)]
    assert ("NetworkPolicy", ko.NETWORK_POLICY_ISOLATE) in kinds
    assert ("NetworkPolicy", ko.NETWORK_POLICY_NOTEBOOK_INGRESS) in kinds


def test_the_kubeconfig_has_the_server_and_the_token() -> None:
    config = ko.kubeconfig(
        username="alice", server="https://k8s.example.org:6443", ca_data="Q0E=", token="s3cret", namespace="gp-x"
    )
    assert config["apiVersion"] == "v1" and config["kind"] == "Config"
    (cluster,) = config["clusters"]
    assert cluster["cluster"] == {"server": "https://k8s.example.org:6443", "certificate-authority-data": "Q0E="}
    (user,) = config["users"]
    assert user == {"name": "alice", "user": {"token": "s3cret"}}
    (context,) = config["contexts"]
    assert config["current-context"] == context["name"]
    assert context["context"] == {"cluster": cluster["name"], "user": "alice", "namespace": "gp-x"}


def test_the_token_secret_belongs_to_the_service_account() -> None:
    secret = ko.service_account_token_secret(OWNER, ko.KubeSettings())
    account = ko.service_account(OWNER, ko.KubeSettings())
    assert secret["type"] == "kubernetes.io/service-account-token"
    assert secret["metadata"]["annotations"]["kubernetes.io/service-account.name"] == account["metadata"]["name"]
    assert secret["metadata"]["namespace"] == account["metadata"]["namespace"]


def test_the_vcluster_values_target_the_chart_and_leave_policies_to_the_host_namespace() -> None:
    values = kv.vcluster_values(OWNER, ko.KubeSettings(), api_server_url="https://vc.example.org")
    assert kv.VCLUSTER_CHART_NAME == "vcluster" and kv.VCLUSTER_CHART_REPO == "https://charts.loft.sh"
    assert values["controlPlane"]["distro"]["k8s"]["enabled"] is True
    assert values["exportKubeConfig"]["server"] == "https://vc.example.org"
    assert all(not p["enabled"] for p in values["policies"].values())
    kinds = [o["kind"] for o in kv.vcluster_host_objects(OWNER, PROFILE, ko.KubeSettings())]
    assert kinds == ["Namespace", "ResourceQuota", "LimitRange", "NetworkPolicy", "NetworkPolicy"]
    assert len(kv.vcluster_release_name(LONG_OWNER)) <= 53


# -- notebooks --------------------------------------------------------------------------------------------


def test_the_notebook_reads_its_token_from_the_secret_and_serves_under_its_base_url() -> None:
    secret, service, stateful_set, ingress = ko.notebook_objects(
        OWNER, "lab", image="quay.io/jupyter/minimal-notebook", size=WHOLE, token="t0k", settings=PATH
    )
    assert secret["stringData"] == {"token": "t0k"}
    container = stateful_set["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "quay.io/jupyter/minimal-notebook"
    assert "--ServerApp.base_url=/notebooks/vision/lab/" in container["command"]
    assert not any("t0k" in arg for arg in container["command"])
    assert _env(stateful_set)["JUPYTER_TOKEN"] == {"secretKeyRef": {"name": secret["metadata"]["name"], "key": "token"}}
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert stateful_set["spec"]["replicas"] == 1
    assert stateful_set["spec"]["serviceName"] == service["metadata"]["name"]
    assert service["spec"]["selector"] == stateful_set["spec"]["selector"]["matchLabels"]
    (rule,) = ingress["spec"]["rules"]
    assert rule["host"] == "portal.example.org"
    (path,) = rule["http"]["paths"]
    assert path["path"] == "/notebooks/vision/lab/"
    assert path["backend"]["service"]["name"] == service["metadata"]["name"]
    assert ingress["spec"]["ingressClassName"] == "nginx"


def test_host_mode_gives_each_notebook_its_own_host() -> None:
    ingress = ko.notebook_ingress(OWNER, "lab", HOST)
    assert ingress["spec"]["rules"][0]["host"] == "lab-vision.nb.example.org"
    assert ingress["spec"]["tls"] == [{"secretName": "wildcard-nb", "hosts": ["lab-vision.nb.example.org"]}]
    assert ko.notebook_url(OWNER, "lab", HOST) == "https://lab-vision.nb.example.org/notebooks/vision/lab/"
    with pytest.raises(ko.UnsupportedRequest):
        ko.notebook_ingress(OWNER, "lab", ko.KubeSettings(ingress_mode="host"))


def test_the_builders_are_pure() -> None:
    spec = _job(env={"A": "1"})
    assert ko.job_objects(OWNER, spec, SHARED) == ko.job_objects(OWNER, spec, SHARED)
    first = ko.namespace_objects(OWNER, PROFILE, ["alice"], SHARED)
    first[0]["metadata"]["labels"]["tampered"] = "yes"
    assert "tampered" not in ko.namespace_objects(OWNER, PROFILE, ["alice"], SHARED)[0]["metadata"]["labels"]


def test_it_writes_fractional_cpu_and_memory_as_kubernetes_quantities() -> None:
    assert ko.cpu_quantity(4) == "4" and ko.cpu_quantity(1.5) == "1500m" and ko.cpu_quantity(0.25) == "250m"
    assert ko.memory_quantity(16) == "16Gi" and ko.memory_quantity(1.5) == "1536Mi"
    item = ko.limit_range(OWNER, ko.Size(cpu_cores=0.5, memory_gb=0.75), ko.KubeSettings())["spec"]["limits"][0]
    assert item["default"] == item["max"] == {"cpu": "500m", "memory": "768Mi"}


def test_a_mig_profile_is_asked_for_as_its_own_resource() -> None:
    settings = ko.KubeSettings(gpu_type_resources={"a100-1g-10gb": "nvidia.com/mig-1g.10gb"})
    mig = ko.Size(cpu_cores=4, memory_gb=16, gpus=Decimal(2), gpu_type="a100-1g-10gb")
    manifest = ko.job(OWNER, _job(size=mig), settings)
    kubernetes_validate.validate(manifest, K8S_VERSION, strict=True)
    assert manifest["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/mig-1g.10gb"] == "2"
    assert ko.resource_quota(OWNER, mig, settings)["spec"]["hard"]["requests.nvidia.com/mig-1g.10gb"] == "2"


def test_the_vcluster_installer_runs_helm_with_the_values_in_the_namespace() -> None:
    config_map, account, binding, installer = kv.vcluster_installer_objects(
        OWNER, ko.KubeSettings(helm_image="alpine/helm:3.17.3"), api_server_url="https://vc.example.org"
    )
    ns = ko.namespace_name(OWNER, ko.KubeSettings())
    assert {o["metadata"]["namespace"] for o in (config_map, account, binding, installer)} == {ns}
    values = json.loads(config_map["data"][kv.VCLUSTER_VALUES_FILE])
    assert values == kv.vcluster_values(OWNER, ko.KubeSettings(), api_server_url="https://vc.example.org")
    assert values["exportKubeConfig"]["secret"]["name"] == kv.vcluster_kubeconfig_secret_name(OWNER)
    assert binding["roleRef"]["name"] == "admin" and binding["roleRef"]["kind"] == "ClusterRole"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account["metadata"]["name"], "namespace": ns}]
    pod = installer["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == account["metadata"]["name"]
    (container,) = pod["containers"]
    command = container["command"]
    assert command[:5] == ["helm", "upgrade", "--install", kv.vcluster_release_name(OWNER), kv.VCLUSTER_CHART_NAME]
    assert command[command.index("--version") + 1] == kv.VCLUSTER_CHART_VERSION
    assert command[command.index("--namespace") + 1] == ns
    (mount,) = container["volumeMounts"]
    assert command[command.index("--values") + 1] == f"{mount['mountPath']}/{kv.VCLUSTER_VALUES_FILE}"
    assert pod["volumes"] == [{"name": mount["name"], "configMap": {"name": config_map["metadata"]["name"]}}]


def test_a_workspaces_jobs_namespace_is_not_an_instances_namespace() -> None:
    settings = ko.KubeSettings()
    jobs = ko.jobs_namespace_name("vision", settings)
    assert jobs.startswith("gp-vision-jobs-") and DNS_LABEL.match(jobs)
    assert jobs != ko.namespace_name(ko.Owner("vision", "jobs"), settings)
    assert jobs != ko.jobs_namespace_name("vision2", settings)
    namespace, policy = ko.jobs_namespace_objects("vision", settings)
    assert namespace["metadata"]["name"] == policy["metadata"]["namespace"] == jobs
    job = ko.job(ko.jobs_owner("vision", settings), _job(), settings)
    assert job["metadata"]["namespace"] == jobs


def test_a_given_namespace_and_base_url_are_used_as_they_are() -> None:
    owner = ko.Owner("vision", "dev", namespace="gp-vision-dev-0123456789")
    objs = ko.notebook_objects(owner, "lab", image="img", size=NO_GPU, token="t", settings=PATH, base_url="/x/lab/")
    assert {o["metadata"]["namespace"] for o in objs} == {"gp-vision-dev-0123456789"}
    stateful_set, ingress = objs[2], objs[3]
    assert "--ServerApp.base_url=/x/lab/" in stateful_set["spec"]["template"]["spec"]["containers"][0]["command"]
    assert ingress["spec"]["rules"][0]["http"]["paths"][0]["path"] == "/x/lab/"


def _container_env(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    workload = next(o for o in objects if o["kind"] == kind)
    containers: list[dict[str, Any]] = workload["spec"]["template"]["spec"]["containers"]
    return [var for container in containers for var in container["env"]]


@pytest.mark.parametrize("kind", ["Job", "StatefulSet"])
def test_a_workloads_portal_credential_is_read_from_a_secret_never_written_in_its_pods(kind: str) -> None:
    if kind == "Job":
        objects = ko.job_objects(
            OWNER, _job(env={"GPUPORTAL_TOKEN": "mine", "EPOCHS": "3"}, portal_env=PORTAL_ENV), SHARED
        )
    else:
        objects = ko.notebook_objects(
            OWNER, "lab", image="img", size=NO_GPU, token="t", settings=HOST, portal_env=PORTAL_ENV
        )
    env = {var["name"]: var for var in _container_env(objects, kind)}
    assert env["GPUPORTAL_URL"] == {"name": "GPUPORTAL_URL", "value": "https://portal.example.org"}
    assert env["GPUPORTAL_WORKSPACE"]["value"] == "vision"
    ref = env["GPUPORTAL_TOKEN"]["valueFrom"]["secretKeyRef"]  # the portal's, not the job's own variable
    secret = next(o for o in objects if o["kind"] == "Secret" and o["metadata"]["name"] == ref["name"])
    assert secret["stringData"][ref["key"]] == PORTAL_ENV["GPUPORTAL_TOKEN"]
    # Created before the pods that read it, and nowhere else in plain text.
    assert objects.index(secret) < objects.index(next(o for o in objects if o["kind"] == kind))
    for obj in objects:
        if obj is not secret:
            assert PORTAL_ENV["GPUPORTAL_TOKEN"] not in json.dumps(obj), obj["kind"]
    if kind == "Job":
        assert [v["name"] for v in _container_env(objects, kind)].count("GPUPORTAL_TOKEN") == 1


def test_a_workload_without_a_portal_credential_gets_no_secret_for_it() -> None:
    objects = ko.job_objects(OWNER, _job(portal_env={"GPUPORTAL_URL": "https://portal.example.org"}), SHARED)
    assert [o["kind"] for o in objects] == ["Service", "Job"]
    assert "GPUPORTAL_TOKEN" not in {var["name"] for var in _container_env(objects, "Job")}
