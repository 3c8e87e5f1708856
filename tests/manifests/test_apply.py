"""`/api/v1/admin/manifests/`: applying, planning, pruning and exporting the platform as documents."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django.contrib.auth.models import Group

from apps.alerts.models import AlertRule
from apps.audit.events import Event
from apps.audit.models import AuditEvent
from apps.catalog.models import ComputeProfile, InferenceProfile, NotebookProfile
from apps.elastic.models import PoolScaling
from apps.inventory.actions import do_sync_local_cluster
from apps.inventory.discovery import parse_declared
from apps.inventory.models import Cluster
from apps.provisioning.models import ProvisioningPolicy
from apps.workspaces.models import Cohort, GPUQuota, Workspace
from tests.manifests.documents import actions_of, apply, doc, items, platform
from tests.personas import World

URL = "/api/v1/admin/manifests/"


def problems(response: Any) -> list[dict[str, Any]]:
    assert response.status_code == 400, response.json()
    return list(response.json()["error"]["problems"])


def test_it_creates_every_kind_through_the_actions(world: World) -> None:
    client = world.client(world.admin)
    last = AuditEvent.objects.order_by("-id").values_list("id", flat=True).first()
    answer = apply(client, platform())
    assert answer.status_code == 200, answer.json()
    assert answer.json()["applied"] is True
    assert actions_of(answer.json()) == {
        ("Group", "ml-team"): "created", ("Cluster", "slurm-a"): "created", ("NodePool", "local/default"): "changed",
        ("ComputeProfile", "gpu-2"): "created", ("NotebookProfile", "datasci"): "created",
        ("InferenceProfile", "llama-small"): "created", ("Cohort", "research"): "created",
        ("Workspace", "vision"): "created", ("AlertRule", "Vision queue"): "created",
    }  # fmt: skip

    assert Cluster.objects.get(name="slurm-a").connection == {"partition": "gpu"}
    scaling = PoolScaling.objects.get(pool__cluster__name="local", pool__name="default")
    assert (scaling.provider, scaling.command, scaling.max_nodes, scaling.scale_down_delay_s) == (
        "command", "/bin/true", 1, 900)  # fmt: skip
    assert ComputeProfile.objects.get(name="gpu-2").gpu_count == Decimal("2")
    assert list(NotebookProfile.objects.get(name="datasci").visible_to.values_list("name", flat=True)) == ["ml-team"]
    assert InferenceProfile.objects.get(name="llama-small").concurrency == 8
    vision = Workspace.objects.get(name="vision")
    assert (vision.assigned_group.name, vision.cohort.name, vision.max_instances, vision.can_borrow) == (
        "ml-team", "research", 6, True)  # fmt: skip
    assert [p.name for p in vision.allowed_profiles.all()] == ["gpu-2"]
    quota = GPUQuota.objects.get(workspace=vision)
    assert (quota.gpu_type, quota.gpus, quota.borrowing_limit) == ("h100", Decimal("4"), Decimal("2"))
    policy = ProvisioningPolicy.objects.get(workspace=vision)
    assert (policy.auto_approve_max_s, policy.max_duration_s, policy.max_gpus) == (3600, 86400, 4)
    rule = AlertRule.objects.get(name="Vision queue")
    assert (rule.kind, rule.workspace, rule.threshold, rule.emails) == (
        "queue_wait", vision, Decimal("600"), ["ops@example.org"])  # fmt: skip

    # Each change is the actions' own audit event, by the admin, through the API.
    events = set(AuditEvent.objects.filter(id__gt=last).values_list("action", "via", "actor"))
    for event in (Event.GROUP_CREATE, Event.CLUSTER_CREATE, Event.ELASTIC_SET, Event.COMPUTE_PROFILE_CREATE,
                  Event.COHORT_CREATE, Event.WORKSPACE_CREATE, Event.QUOTA_SET, Event.GPR_POLICY_SET,
                  Event.ALERT_RULE_CREATE):  # fmt: skip
        assert any(a == event.value for a, _, _ in events), (event, events)
    assert {(via, actor) for _, via, actor in events} == {("api", world.admin.pk)}


def test_applying_twice_changes_nothing_the_second_time(world: World) -> None:
    client = world.client(world.admin)
    assert apply(client, platform()).status_code == 200
    events = AuditEvent.objects.count()

    again = apply(client, platform())
    assert again.status_code == 200
    assert set(actions_of(again.json()).values()) == {"unchanged"}
    assert again.json()["summary"] == {"created": 0, "changed": 0, "unchanged": 9, "deleted": 0}
    assert AuditEvent.objects.count() == events


def test_a_dry_run_shows_field_changes_and_writes_nothing(world: World) -> None:
    client = world.client(world.admin)
    assert apply(client, platform()).status_code == 200
    files = platform()
    files["platform/profiles.yaml"][0]["spec"]["gpu_count"] = 4
    files["platform/workspaces.yaml"][1]["spec"]["gpu_quotas"] = [{"gpu_type": "a100", "gpus": "2"}]
    files["platform/workspaces.yaml"][1]["spec"]["max_instances"] = 8
    events = AuditEvent.objects.count()

    plan = apply(client, files, dry_run=True)
    assert plan.status_code == 200, plan.json()
    assert plan.json()["applied"] is False and plan.json()["dry_run"] is True
    changed = {(d["kind"], d["name"]): d["changes"] for d in plan.json()["documents"] if d["action"] == "changed"}
    assert changed == {
        ("ComputeProfile", "gpu-2"): [{"field": "spec.gpu_count", "from": "2.00", "to": "4.00"}],
        ("Workspace", "vision"): [
            {"field": "spec.max_instances", "from": 6, "to": 8},
            {"field": "spec.gpu_quotas.a100", "from": None,
             "to": {"gpu_type": "a100", "gpus": "2.00", "borrowing_limit": None, "lending_limit": None}},
            {"field": "spec.gpu_quotas.h100",
             "from": {"gpu_type": "h100", "gpus": "4.00", "borrowing_limit": "2.00", "lending_limit": None},
             "to": None},
        ],
    }  # fmt: skip
    assert ComputeProfile.objects.get(name="gpu-2").gpu_count == Decimal("2")
    assert list(GPUQuota.objects.filter(workspace__name="vision").values_list("gpu_type", flat=True)) == ["h100"]
    assert AuditEvent.objects.count() == events

    applied = apply(client, files)
    assert applied.json()["summary"]["changed"] == 2
    assert ComputeProfile.objects.get(name="gpu-2").gpu_count == Decimal("4")
    assert list(GPUQuota.objects.filter(workspace__name="vision").values_list("gpu_type", flat=True)) == ["a100"]


def test_a_dry_run_on_an_empty_portal_writes_nothing(world: World) -> None:
    client = world.client(world.admin)
    events = AuditEvent.objects.count()
    plan = apply(client, platform(), dry_run=True)
    assert plan.status_code == 200, plan.json()
    assert plan.json()["summary"]["created"] == 8
    assert not Workspace.objects.filter(name="vision").exists()
    assert not Group.objects.filter(name="ml-team").exists()
    assert not PoolScaling.objects.exists()
    assert AuditEvent.objects.count() == events


def test_one_invalid_document_anywhere_applies_nothing_and_says_where(world: World) -> None:
    files = platform()
    files["platform/profiles.yaml"].append(doc("ComputeProfile", "gpu-big", {"gpu_type": "h100", "gpu_count": 3000}))
    files["platform/workspaces.yaml"][2]["spec"]["kind"] = "no_such_kind"
    client = world.client(world.admin)
    events = AuditEvent.objects.count()

    response = apply(client, files)
    found = problems(response)
    assert [(p["source"], p["index"], p["kind"], p["name"], p["field"]) for p in found] == [
        ("platform/profiles.yaml", 4, "ComputeProfile", "gpu-big", "spec.gpu_count"),
        ("platform/workspaces.yaml", 3, "AlertRule", "Vision queue", "spec.kind"),
    ]
    message = response.json()["error"]["message"]
    assert message.startswith("platform/profiles.yaml, document 4 (ComputeProfile gpu-big): spec.gpu_count: ")
    assert "(and 1 more)" in message
    # The valid documents before and after it are not applied either.
    assert not Group.objects.filter(name="ml-team").exists()
    assert not Cluster.objects.filter(name="slurm-a").exists()
    assert not ComputeProfile.objects.filter(name__in=["gpu-2", "gpu-big"]).exists()
    assert not Workspace.objects.filter(name="vision").exists()
    assert not PoolScaling.objects.exists()
    assert AuditEvent.objects.count() == events


def test_an_action_s_refusal_points_at_the_document_field(world: World) -> None:
    files = {
        "pools.yaml": [
            doc(
                "NodePool",
                "local/default",
                {"autoscaling": {"provider": "command", "command": "/bin/true", "max_nodes": 5}},
            )
        ]
    }
    found = problems(apply(world.client(world.admin), files))
    assert [(p["source"], p["index"], p["field"]) for p in found] == [("pools.yaml", 1, "spec.autoscaling.max_nodes")]
    assert "at most 1" in found[0]["message"]

    files = {"ws.yaml": [doc("Workspace", "w", {"provisioning_policy": {"auto_approve_max_s": 90000,
                                                                        "max_duration_s": 3600}})]}  # fmt: skip
    found = problems(apply(world.client(world.admin), files))
    assert [p["field"] for p in found] == ["spec.provisioning_policy.auto_approve_max_s"]
    assert not Workspace.objects.filter(name="w").exists()


def test_malformed_documents_are_refused_by_their_shape(world: World) -> None:
    files = {"bad.yaml": [
        {"apiVersion": "v1", "kind": "ComputeProfile", "metadata": {"name": "x"}},
        {"apiVersion": "gpuportal.io/v1", "kind": "Pod", "metadata": {"name": "x"}},
        {"apiVersion": "gpuportal.io/v1", "kind": "Cohort", "metadata": {}},
        {"apiVersion": "gpuportal.io/v1", "kind": "Cohort", "metadata": {"name": "c"}, "spec": {"colour": "red"}},
        doc("Cohort", "d"), doc("Cohort", "d"), ["not", "a", "document"],
    ]}  # fmt: skip
    found = problems(apply(world.client(world.admin), files))
    assert [(p["index"], p["field"]) for p in found] == [
        (1, "apiVersion"),
        (2, "kind"),
        (3, "metadata.name"),
        (6, "metadata.name"),
        (7, ""),
        (4, "spec.colour"),
    ]
    assert "Also given in bad.yaml, document 5" in found[3]["message"]
    assert not Cohort.objects.exists()


def test_a_credential_in_a_cluster_connection_is_refused(world: World) -> None:
    client = world.client(world.admin)
    for connection, field in (
        ({"host": "https://k8s:6443", "token": "abcdef0123456789"}, "spec.connection.token"),
        ({"kubeconfig_data": "-----BEGIN RSA PRIVATE KEY-----\nMIIE"}, "spec.connection.kubeconfig_data"),
        ({"host": "https://k8s:6443", "password": "hunter2"}, "spec.connection.password"),
    ):
        files = {"clusters.yaml": [doc("Cluster", "k8s", {"kind": "kubernetes", "connection": connection})]}
        found = problems(apply(client, files))
        assert [(p["field"], p["kind"]) for p in found] == [(field, "Cluster")]
        assert "never written in a manifest" in found[0]["message"]
        assert not Cluster.objects.filter(name="k8s").exists()

    # A credential named by the file that holds it is what a manifest says.
    files = {"clusters.yaml": [doc("Cluster", "k8s", {"kind": "kubernetes", "connection": {
        "kubeconfig": "/etc/gpuportal/clusters/k8s.kubeconfig", "ingress_tls_secret": "portal-tls"}})]}  # fmt: skip
    assert apply(client, files).status_code == 200
    # An export never shows one that the API let in.
    Cluster.objects.filter(name="k8s").update(connection={"kubeconfig": "/k", "token": "abcdef0123456789"})
    exported = client.get(URL).json()["items"]
    assert [d["spec"]["connection"] for d in exported if d["metadata"]["name"] == "k8s"] == [{"kubeconfig": "/k"}]


def test_prune_deletes_what_the_documents_no_longer_name(world: World) -> None:
    client = world.client(world.admin)
    files = {"cohorts.yaml": [doc("Cohort", "research"), doc("Cohort", "old")]}
    assert apply(client, files).status_code == 200
    files = {"cohorts.yaml": [doc("Cohort", "research")]}

    plan = apply(client, files, prune=True, dry_run=True)
    assert actions_of(plan.json()) == {("Cohort", "research"): "unchanged", ("Cohort", "old"): "deleted"}
    assert Cohort.objects.filter(name="old").exists()

    pruned = apply(client, files, prune=True)
    assert pruned.json()["summary"]["deleted"] == 1
    assert list(Cohort.objects.values_list("name", flat=True)) == ["research"]
    # Only the kinds the documents name: the profiles and workspaces they do not mention stay.
    assert ComputeProfile.objects.filter(name="gpu-1").exists()
    assert Workspace.objects.filter(name="team-a").exists()
    assert AuditEvent.objects.filter(action=Event.COHORT_DELETE.value).count() == 1


def test_prune_refuses_what_is_in_use_as_the_api_does(world: World) -> None:
    client = world.client(world.admin)
    response = apply(client, {"groups.yaml": [doc("Group", "ml-team")]}, prune=True)
    found = problems(response)
    assert {(p["source"], p["kind"], p["name"]) for p in found} == {("(prune)", "Group", "team-a"),
                                                                     ("(prune)", "Group", "team-b")}  # fmt: skip
    texts = sorted(p["text"] for p in found)
    assert texts[0] == ("(prune) (Group team-a): cannot be pruned: Group team-a is assigned to workspace team-a; "
                        "reassign it first.")  # fmt: skip
    assert set(Group.objects.values_list("name", flat=True)) == {"team-a", "team-b"}
    assert not Group.objects.filter(name="ml-team").exists()


def test_a_private_workspace_is_no_manifest_s(world: World) -> None:
    private = Workspace.objects.get(kind=Workspace.Kind.PRIVATE, assigned_user=world.alice)
    found = problems(
        apply(world.client(world.admin), {"w.yaml": [doc("Workspace", private.name, {"max_instances": 9})]})
    )
    assert found[0]["field"] == "metadata.name" and "private workspace" in found[0]["message"]
    exported = world.client(world.admin).get(URL).json()["items"]
    assert private.name not in {d["metadata"]["name"] for d in exported if d["kind"] == "Workspace"}


def test_only_platform_admins_export_or_apply(world: World) -> None:
    for user in (world.alice, world.bob, world.charlie, world.victor):
        client = world.client(user)
        assert client.get(URL).status_code == 403
        assert apply(client, platform()).status_code == 403
        assert apply(client, platform(), dry_run=True).status_code == 403
    assert not Workspace.objects.filter(name="vision").exists()


def export(world: World) -> list[dict[str, Any]]:
    response = world.client(world.admin).get(URL)
    assert response.status_code == 200
    return list(response.json()["items"])


def test_export_then_apply_on_an_empty_portal_makes_the_same_platform(world: World) -> None:
    assert apply(world.client(world.admin), platform()).status_code == 200
    before = export(world)
    assert {d["kind"] for d in before} == {"Group", "Cluster", "NodePool", "ComputeProfile", "NotebookProfile",
                                           "InferenceProfile", "Cohort", "Workspace", "AlertRule"}  # fmt: skip
    # A portal with nothing in it (but its admin): its first start syncs this machine's cluster.
    for model in (AlertRule, Workspace, Cohort, ComputeProfile, NotebookProfile, InferenceProfile, PoolScaling,
                  Cluster, Group):  # fmt: skip
        model.objects.all().delete()
    do_sync_local_cluster(parse_declared("8xh100"))
    assert export(world) == [
        {"apiVersion": "gpuportal.io/v1", "kind": "Cluster", "metadata": {"name": "local"},
         "spec": {"kind": "local", "connection": {}, "placement": "binpack", "is_default": True, "enabled": True}}
    ]  # fmt: skip

    first = world.client(world.admin).post(URL, {"documents": items({"export.yaml": before})}, format="json")
    assert first.status_code == 200, first.json()
    assert export(world) == before
    again = world.client(world.admin).post(URL, {"documents": items({"export.yaml": before})}, format="json")
    assert set(actions_of(again.json()).values()) == {"unchanged"}
