"""The Workspace kind: a shared workspace with its limits and policies, its GPU quotas
(``spec.gpu_quotas``) and its provisioning policy (``spec.provisioning_policy``), each through the
API's serializers and the workspace actions. Private workspaces are their users' (made at their
first sign-in): no document names one."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from apps.errors import ActionError
from apps.manifests.errors import Invalid
from apps.manifests.kinds import Context, Prepared, SerializerKind, as_decimals, diff, spec_errors
from apps.provisioning import actions as provisioning
from apps.provisioning.models import ProvisioningPolicy
from apps.provisioning.policy_api import PolicySerializer
from apps.workspaces import actions
from apps.workspaces.api import GPUQuotaSerializer, WorkspaceSerializer
from apps.workspaces.models import GPUQuota, Workspace

QUOTA_FIELDS = ("gpu_type", "gpus", "borrowing_limit", "lending_limit")
POLICY_FIELDS = ("auto_approve_max_s", "max_duration_s", "max_gpus")


class WorkspaceKind(SerializerKind):
    """A shared workspace. ``gpu_quotas`` given (a list, even empty) is the whole of its quotas:
    those it leaves out are removed; left out, its quotas stay as they are. ``provisioning_policy``
    given sets the workspace's own policy; left out (or null), it keeps the one it has."""

    kind = "Workspace"
    model = Workspace
    serializer = WorkspaceSerializer
    fields = ("display_name", "description", "assignee_kind", "assigned_group", "assigned_user", "max_instances",
              "max_notebooks", "cpu_cores", "memory_gb", "disk_gb", "allowed_profiles", "allowed_gpu_types",
              "max_runtime_s", "max_idle_s", "can_borrow", "fair_share_weight", "cohort")  # fmt: skip

    def objects(self) -> Iterable[Any]:
        return Workspace.objects.filter(kind=Workspace.Kind.SHARED).order_by("name")

    def find(self, name: str) -> Any | None:
        return Workspace.objects.filter(name=name).first()

    def spec_of(self, obj: Any, ctx: Context) -> dict[str, Any]:
        spec = self.represent(obj, ctx)
        spec["gpu_quotas"] = self.quotas_of(obj, ctx)
        policy = self.policy_of(obj, ctx)
        if policy is not None:
            spec["provisioning_policy"] = policy
        return spec

    def quotas_of(self, workspace: Workspace, ctx: Context) -> list[dict[str, Any]]:
        rows = GPUQuota.objects.filter(workspace=workspace).order_by("gpu_type")
        shown = GPUQuotaSerializer(rows, many=True, context={"request": ctx.request}).data
        return [{name: row[name] for name in QUOTA_FIELDS} for row in shown]

    def policy_of(self, workspace: Workspace, ctx: Context) -> dict[str, Any] | None:
        row = ProvisioningPolicy.objects.filter(workspace=workspace).first()
        if row is None:
            return None
        shown = PolicySerializer(row, context={"request": ctx.request}).data
        return {name: shown[name] for name in POLICY_FIELDS}

    def prepare(self, obj: Any | None, name: str, spec: dict[str, Any], ctx: Context) -> Prepared:
        if obj is not None and obj.kind == Workspace.Kind.PRIVATE:
            raise Invalid({"metadata.name": [f"{name} is a private workspace: it is its user's, not a manifest's."]})
        spec = dict(spec)
        quotas = spec.pop("gpu_quotas", None)
        policy = spec.pop("provisioning_policy", None)
        validated, shown = self.validate(obj, name, spec, ctx)
        changes = diff(None if obj is None else self.represent(obj, ctx), shown)
        if quotas is not None and not isinstance(quotas, list):
            raise Invalid({"spec.gpu_quotas": ["Expected a list of quotas, each with gpu_type and gpus."]})
        if policy is not None and not isinstance(policy, dict):
            raise Invalid({"spec.provisioning_policy": ["Expected an object: auto_approve_max_s, max_duration_s, "
                                                        "max_gpus."]})  # fmt: skip
        if obj is None:
            changes += [
                {"field": f"spec.{key}", "from": None, "to": value}
                for key, value in (("gpu_quotas", quotas), ("provisioning_policy", policy))
                if value is not None
            ]
            return Prepared(changes, lambda: self.create(validated, quotas, policy, ctx))
        quota_plan = self.plan_quotas(obj, quotas, ctx) if quotas is not None else None
        policy_plan = self.plan_policy(obj, policy, ctx) if policy is not None else None
        for part in (quota_plan, policy_plan):
            if part is not None:
                changes += part.changes
        if not changes:
            return Prepared([], lambda: None)
        fields = {k: v for k, v in validated.items() if k != "name"}

        def run() -> None:
            if any(change["field"].split(".")[1] in self.fields for change in changes):
                actions.do_update_workspace(obj, **fields, **ctx.action_kwargs())
            for part in (quota_plan, policy_plan):
                if part is not None:
                    part.run()

        return Prepared(changes, run)

    def create(self, validated: dict[str, Any], quotas: list[Any] | None, policy: dict[str, Any] | None,
               ctx: Context) -> None:  # fmt: skip
        workspace = actions.do_create_workspace(**validated, **ctx.action_kwargs())
        for part in (
            self.plan_quotas(workspace, quotas, ctx) if quotas is not None else None,
            self.plan_policy(workspace, policy, ctx) if policy is not None else None,
        ):
            if part is not None:
                part.run()

    def plan_quotas(self, workspace: Workspace, quotas: list[Any], ctx: Context) -> Prepared:
        """The workspace's quotas made exactly ``quotas``: each set or removed through its action."""
        wanted: dict[str, dict[str, Any]] = {}
        errors: dict[str, list[str]] = {}
        for index, quota in enumerate(quotas):
            where = f"spec.gpu_quotas[{index}]"
            if not isinstance(quota, dict):
                errors[where] = ["Expected an object: gpu_type, gpus, borrowing_limit, lending_limit."]
                continue
            unknown = sorted(set(quota) - set(QUOTA_FIELDS))
            if unknown:
                errors.update({f"{where}.{k}": [f"Unknown field. A quota takes: {', '.join(QUOTA_FIELDS)}."]
                               for k in unknown})  # fmt: skip
                continue
            probe = GPUQuotaSerializer(context={"request": ctx.request})
            data = {"workspace": workspace.name, **as_decimals(probe, quota)}
            serializer = GPUQuotaSerializer(data=data, context={"request": ctx.request})
            if not serializer.is_valid():
                errors.update(spec_errors(serializer.errors, where))
                continue
            row = serializer.validated_data
            if row["gpu_type"] in wanted:
                errors[f"{where}.gpu_type"] = [f"A quota of {row['gpu_type']} is given twice."]
                continue
            wanted[row["gpu_type"]] = {
                "gpus": row["gpus"], "borrowing_limit": row.get("borrowing_limit"),
                "lending_limit": row.get("lending_limit"),
                "shown": {k: serializer.fields[k].to_representation(row[k]) if row.get(k) is not None else None
                          for k in QUOTA_FIELDS},
            }  # fmt: skip
        if errors:
            raise Invalid(errors)
        before = {q["gpu_type"]: q for q in self.quotas_of(workspace, ctx)}
        after = {gpu_type: w["shown"] for gpu_type, w in wanted.items()}
        changes = [
            {"field": f"spec.gpu_quotas.{gpu_type}", "from": before.get(gpu_type), "to": after.get(gpu_type)}
            for gpu_type in sorted(set(before) | set(after))
            if before.get(gpu_type) != after.get(gpu_type)
        ]

        def run() -> None:
            for change in changes:
                gpu_type = str(change["field"]).rsplit(".", 1)[1]
                if gpu_type in wanted:
                    terms = {k: v for k, v in wanted[gpu_type].items() if k != "shown"}
                    actions.do_set_gpu_quota(workspace, gpu_type, **terms, **ctx.action_kwargs())
                else:
                    quota = GPUQuota.objects.get(workspace=workspace, gpu_type=gpu_type)
                    actions.do_delete_gpu_quota(quota, **ctx.action_kwargs())

        return Prepared(changes, run)

    def plan_policy(self, workspace: Workspace, policy: dict[str, Any], ctx: Context) -> Prepared:
        """The workspace's own provisioning policy made ``policy``, as the API's PUT makes it."""
        unknown = sorted(set(policy) - set(POLICY_FIELDS))
        if unknown:
            takes = ", ".join(POLICY_FIELDS)
            raise Invalid({f"spec.provisioning_policy.{k}": [f"Unknown field. It takes: {takes}."] for k in unknown})
        serializer = PolicySerializer(data={"workspace": workspace.name, **policy}, context={"request": ctx.request})
        if not serializer.is_valid():
            raise Invalid(spec_errors(serializer.errors, "spec.provisioning_policy"))
        data = serializer.validated_data
        terms = {"auto_approve_max_s": data.get("auto_approve_max_s") or None,
                 "max_duration_s": data["max_duration_s"], "max_gpus": data.get("max_gpus")}  # fmt: skip
        before = self.policy_of(workspace, ctx)
        changes = diff(before, terms, "spec.provisioning_policy") if before is not None else [
            {"field": "spec.provisioning_policy", "from": None, "to": terms}]  # fmt: skip
        return Prepared(changes, lambda: self.set_policy(workspace, terms, ctx))

    def set_policy(self, workspace: Workspace, terms: dict[str, Any], ctx: Context) -> None:
        try:
            provisioning.do_set_policy(workspace, **terms, **ctx.action_kwargs())
        except ActionError as exc:
            field = f"spec.provisioning_policy.{exc.field}" if exc.field else "spec.provisioning_policy"
            raise Invalid({field: [exc.message]}) from None

    def delete(self, obj: Any, ctx: Context) -> None:
        actions.do_delete_workspace(obj, **ctx.action_kwargs())
