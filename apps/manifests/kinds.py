"""The kinds of manifest documents: what each is, how it is found, validated, shown and changed.

A kind (``Kind``) is the contract between the manifest engine (apps/manifests/engine.py) and one
thing admins manage. Its hooks:

- ``objects()``: every managed object of the kind today (what ``export`` writes and ``--prune``
  may delete); ``find(name)``: the one a document names, or None.
- ``name_of(obj)`` and ``spec_of(obj)``: a document's ``metadata.name`` and ``spec`` for an object,
  in the API's representation, so that applying an exported document changes nothing.
- ``prepare(obj, name, spec)``: validate a document with the API's own serializers and return a
  ``Prepared``: the field-level changes against today (empty: unchanged) and a ``run()`` that
  makes them through the same actions as the console and the API. Raises ``Invalid`` (fields
  named as in the document: ``spec.gpu_count``) or ``ActionError``.
- ``delete(obj)``: remove it through its action (which refuses what is in use, as the API does).

Every spec field is the API's field of the same name (docs/api.md), so the rules are the API's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, ClassVar

from django.contrib.auth.models import Group
from rest_framework import serializers
from rest_framework.request import Request

from apps.accounts import actions as accounts
from apps.accounts.api import GroupSerializer
from apps.alerts import actions as alerts
from apps.alerts.api import AlertRuleSerializer
from apps.alerts.models import AlertRule
from apps.audit.actions import Origin
from apps.catalog import actions as catalog
from apps.catalog.api import ComputeProfileSerializer, NotebookProfileSerializer
from apps.catalog.models import ComputeProfile, InferenceProfile, NotebookProfile
from apps.elastic import actions as elastic
from apps.elastic.api import PoolScalingSerializer
from apps.elastic.models import PoolScaling
from apps.errors import ActionError
from apps.inference.api import InferenceProfileSerializer
from apps.inventory import actions as inventory
from apps.inventory.api import ClusterSerializer
from apps.inventory.models import Cluster, NodePool
from apps.manifests.errors import Invalid
from apps.manifests.secrets import check_no_inline_secrets, without_secrets
from apps.workspaces import actions as workspaces
from apps.workspaces.api import CohortSerializer
from apps.workspaces.models import Cohort

API_VERSION = "gpuportal.io/v1"


@dataclass(frozen=True)
class Context:
    """Who applies, from where: the request the serializers read (the acting user, JSON rules)."""

    request: Request

    @property
    def user(self) -> Any:
        return self.request.user

    def action_kwargs(self) -> dict[str, Any]:
        return {"acting_user": self.request.user, "origin": Origin.from_request(self.request)}


@dataclass
class Prepared:
    """A validated document: its changes (``[{"field", "from", "to"}]``) and how to make them."""

    changes: list[dict[str, Any]]
    run: Callable[[], None] = field(repr=False)


def spec_errors(detail: Any, prefix: str = "spec") -> dict[str, list[str]]:
    """DRF's nested errors as {"spec.field": [messages]}, "name" as metadata.name."""
    out: dict[str, list[str]] = {}
    if isinstance(detail, dict):
        for key, value in detail.items():
            if prefix == "spec" and key == "name":
                where = "metadata.name"
            elif key == "non_field_errors":
                where = prefix
            else:
                where = f"{prefix}.{key}"
            for name, messages in spec_errors(value, where).items():
                out.setdefault(name, []).extend(messages)
    elif isinstance(detail, list) and any(isinstance(item, (dict, list)) for item in detail):
        for index, item in enumerate(detail):
            for name, messages in spec_errors(item, f"{prefix}[{index}]").items():
                out.setdefault(name, []).extend(messages)
    else:
        out[prefix] = [str(item) for item in detail] if isinstance(detail, list) else [str(detail)]
    return out


def action_error(exc: ActionError, prefix: str = "spec") -> Invalid:
    """An action's refusal as a document error on the field it names."""
    where = "metadata.name" if exc.field == "name" else (f"{prefix}.{exc.field}" if exc.field else prefix)
    return Invalid({where: [exc.message]})


def as_decimals(serializer: serializers.Serializer, spec: dict[str, Any]) -> dict[str, Any]:
    """YAML's numbers as the strings the API takes for its decimal fields (``gpus: 1`` is "1")."""
    out = dict(spec)
    for name, value in spec.items():
        f = serializer.fields.get(name)
        if isinstance(f, serializers.DecimalField) and isinstance(value, (int, float)) and not isinstance(value, bool):
            out[name] = format(Decimal(str(value)), "f")
    return out


def comparable(value: Any) -> Any:
    """Lists of names compare as sets (a profile's groups); everything else as it is."""
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return sorted(value)
    return value


def diff(before: dict[str, Any] | None, after: dict[str, Any], prefix: str = "spec") -> list[dict[str, Any]]:
    """Field-level changes from ``before`` (None: a new object) to ``after``."""
    changes = []
    for name, value in after.items():
        old = None if before is None else before.get(name)
        if before is None or comparable(old) != comparable(value):
            changes.append({"field": f"{prefix}.{name}", "from": old, "to": value})
    return changes


class Kind:
    """One kind of document; see the module docstring for the hooks' contract."""

    kind: ClassVar[str]

    def objects(self) -> Iterable[Any]:
        raise NotImplementedError

    def find(self, name: str) -> Any | None:
        raise NotImplementedError

    def name_of(self, obj: Any) -> str:
        return str(obj.name)

    def spec_of(self, obj: Any, ctx: Context) -> dict[str, Any]:
        raise NotImplementedError

    def prepare(self, obj: Any | None, name: str, spec: dict[str, Any], ctx: Context) -> Prepared:
        raise NotImplementedError

    def delete(self, obj: Any, ctx: Context) -> None:
        raise NotImplementedError


class SerializerKind(Kind):
    """A kind whose spec is its API serializer's writable fields (``fields``), validated by it."""

    model: ClassVar[Any]
    serializer: ClassVar[type[serializers.Serializer]]
    fields: ClassVar[tuple[str, ...]]

    def objects(self) -> Iterable[Any]:
        found: Iterable[Any] = self.model.objects.order_by("name")
        return found

    def find(self, name: str) -> Any | None:
        return self.model.objects.filter(name=name).first()

    def represent(self, obj: Any, ctx: Context) -> dict[str, Any]:
        shown = self.serializer(obj, context={"request": ctx.request}).data
        return {name: shown[name] for name in self.fields if name in shown}

    def spec_of(self, obj: Any, ctx: Context) -> dict[str, Any]:
        return self.represent(obj, ctx)

    def validate(
        self, obj: Any | None, name: str, spec: dict[str, Any], ctx: Context, extra: tuple[str, ...] = ()
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """The serializer's validated data for the document (all of its fields on creation; those
        it names on a change: a field left out keeps its value), and the spec fields it gives as
        the API shows them (to compare with today's)."""
        unknown = sorted(set(spec) - set(self.fields) - set(extra))
        if unknown:
            takes = ", ".join(self.fields) or "nothing"
            raise Invalid({f"spec.{key}": [f"Unknown field. {self.kind} takes: {takes}."] for key in unknown})
        probe = self.serializer(context={"request": ctx.request})
        data = {"name": name, **as_decimals(probe, spec)}
        serializer = self.serializer(obj, data=data, partial=obj is not None, context={"request": ctx.request})
        if not serializer.is_valid():
            raise Invalid(spec_errors(serializer.errors))
        validated: dict[str, Any] = dict(serializer.validated_data)
        shown = {k: serializer.fields[k].to_representation(v) if v is not None else None
                 for k, v in validated.items() if k in self.fields}  # fmt: skip
        return validated, shown

    def prepare(self, obj: Any | None, name: str, spec: dict[str, Any], ctx: Context) -> Prepared:
        validated, shown = self.validate(obj, name, spec, ctx)
        changes = diff(None if obj is None else self.represent(obj, ctx), shown)
        if obj is not None and not changes:
            return Prepared([], lambda: None)
        if obj is not None:
            validated = {k: v for k, v in validated.items() if k != "name"}
        return Prepared(changes, lambda: self.save(obj, validated, ctx))

    def save(self, obj: Any | None, validated: dict[str, Any], ctx: Context) -> None:
        raise NotImplementedError


class GroupKind(SerializerKind):
    """A group of people (a team, a department), as the identity provider names it. What it grants
    is said where it is granted: a workspace assigned to it (its members are the workspace's
    members), a profile ``visible_to`` it."""

    kind = "Group"
    model = Group
    serializer = GroupSerializer
    fields = ()

    def save(self, obj: Any | None, validated: dict[str, Any], ctx: Context) -> None:
        accounts.do_save_group(obj or Group(), **validated, **ctx.action_kwargs())

    def delete(self, obj: Any, ctx: Context) -> None:
        accounts.do_delete_group(obj, **ctx.action_kwargs())


class ClusterKind(SerializerKind):
    """A registered cluster and its connection settings; a credential is named by the path of a
    file on the portal's hosts (``kubeconfig``), never written in the document."""

    kind = "Cluster"
    model = Cluster
    serializer = ClusterSerializer
    fields = ("kind", "connection", "placement", "is_default", "enabled")

    def spec_of(self, obj: Any, ctx: Context) -> dict[str, Any]:
        spec = self.represent(obj, ctx)
        spec["connection"] = without_secrets(spec.get("connection") or {})
        return spec

    def validate(
        self, obj: Any | None, name: str, spec: dict[str, Any], ctx: Context, extra: tuple[str, ...] = ()
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        check_no_inline_secrets(spec.get("connection"))
        return super().validate(obj, name, spec, ctx, extra)

    def save(self, obj: Any | None, validated: dict[str, Any], ctx: Context) -> None:
        inventory.do_save_cluster(obj or Cluster(), validated, **ctx.action_kwargs())

    def delete(self, obj: Any, ctx: Context) -> None:
        inventory.do_delete_cluster(obj, **ctx.action_kwargs())


class ProfileKind(SerializerKind):
    """A compute, notebook or inference profile: what users launch from."""

    def save(self, obj: Any | None, validated: dict[str, Any], ctx: Context) -> None:
        catalog.do_save_profile(obj or self.model(), **validated, **ctx.action_kwargs())

    def delete(self, obj: Any, ctx: Context) -> None:
        catalog.do_delete_profile(obj, **ctx.action_kwargs())


PROFILE_FIELDS = ("display_name", "description", "published", "visible_to")


class ComputeProfileKind(ProfileKind):
    kind = "ComputeProfile"
    model = ComputeProfile
    serializer = ComputeProfileSerializer
    fields = (*PROFILE_FIELDS, "kind", "gpu_type", "gpu_count", "cpu_cores", "memory_gb")


class NotebookProfileKind(ProfileKind):
    kind = "NotebookProfile"
    model = NotebookProfile
    serializer = NotebookProfileSerializer
    fields = (*PROFILE_FIELDS, "image", "python_packages")


class InferenceProfileKind(ProfileKind):
    kind = "InferenceProfile"
    model = InferenceProfile
    serializer = InferenceProfileSerializer
    fields = (*PROFILE_FIELDS, "server", "server_args", "image", "gpu_type", "gpus", "cpu_cores", "memory_gb",
              "concurrency", "scale_up_after_s", "scale_down_after_s")  # fmt: skip


class CohortKind(SerializerKind):
    """Workspaces that lend each other idle GPU quota (a workspace names its cohort)."""

    kind = "Cohort"
    model = Cohort
    serializer = CohortSerializer
    fields = ("description",)

    def save(self, obj: Any | None, validated: dict[str, Any], ctx: Context) -> None:
        workspaces.do_save_cohort(obj, **validated, **ctx.action_kwargs())

    def delete(self, obj: Any, ctx: Context) -> None:
        workspaces.do_delete_cohort(obj, **ctx.action_kwargs())


SCALING_FIELDS = ("enabled", "provider", "command", "min_nodes", "max_nodes", "scale_down_delay_s", "start_timeout_s",
                  "budget_gpu_hours")  # fmt: skip


class NodePoolKind(Kind):
    """A cluster's node pool (``metadata.name`` is ``CLUSTER/POOL``) and its autoscaling limits
    (``spec.autoscaling``; null or left out: a static pool). Pools themselves come from the
    cluster's discovery: a document names one the inventory has."""

    kind = "NodePool"

    def objects(self) -> Iterable[Any]:
        return NodePool.objects.filter(scaling__isnull=False).select_related("cluster", "scaling")

    def find(self, name: str) -> Any | None:
        cluster, _, pool = name.partition("/")
        return NodePool.objects.filter(cluster__name=cluster, name=pool).select_related("cluster").first()

    def name_of(self, obj: Any) -> str:
        return f"{obj.cluster.name}/{obj.name}"

    def scaling_of(self, pool: NodePool, ctx: Context) -> dict[str, Any] | None:
        scaling = PoolScaling.objects.filter(pool=pool).first()
        if scaling is None:
            return None
        shown = PoolScalingSerializer(scaling, context={"request": ctx.request}).data
        return {name: shown[name] for name in SCALING_FIELDS}

    def spec_of(self, obj: Any, ctx: Context) -> dict[str, Any]:
        return {"autoscaling": self.scaling_of(obj, ctx)}

    def prepare(self, obj: Any | None, name: str, spec: dict[str, Any], ctx: Context) -> Prepared:
        if obj is None:
            raise Invalid(
                {
                    "metadata.name": [
                        f"{name} is not a node pool of the inventory (CLUSTER/POOL): pools come "
                        "from a cluster's discovery (gpuportal cluster discover CLUSTER)."
                    ]
                }
            )
        unknown = sorted(set(spec) - {"autoscaling"})
        if unknown:
            raise Invalid({f"spec.{key}": ["Unknown field. NodePool takes: autoscaling."] for key in unknown})
        wanted = spec.get("autoscaling")
        current = self.scaling_of(obj, ctx)
        if wanted is None:
            if current is None:
                return Prepared([], lambda: None)
            scaling = PoolScaling.objects.get(pool=obj)
            return Prepared([{"field": "spec.autoscaling", "from": current, "to": None}],
                            lambda: _unwrapped(elastic.do_disable)(scaling, **ctx.action_kwargs()))  # fmt: skip
        if not isinstance(wanted, dict):
            raise Invalid({"spec.autoscaling": ["Expected an object of limits, or null for a static pool."]})
        limits = self.limits(obj, wanted, current, ctx)
        after = {**(current or {}), **limits}
        changes = diff(current, after, "spec.autoscaling") if current is not None else [
            {"field": "spec.autoscaling", "from": None, "to": after}]  # fmt: skip
        if not changes:
            return Prepared([], lambda: None)
        limits_now = elastic.Limits(**{**({} if current is None else current), **limits})
        return Prepared(changes, lambda: self.set_scaling(obj, limits_now, ctx))

    def set_scaling(self, pool: NodePool, limits: Any, ctx: Context) -> None:
        try:
            _unwrapped(elastic.do_set_pool_scaling)(pool, limits, **ctx.action_kwargs())
        except ActionError as exc:
            raise action_error(exc, "spec.autoscaling") from None

    def limits(self, pool: NodePool, wanted: dict[str, Any], current: dict[str, Any] | None, ctx: Context) -> Any:
        unknown = sorted(set(wanted) - set(SCALING_FIELDS))
        if unknown:
            takes = ", ".join(SCALING_FIELDS)
            raise Invalid({f"spec.autoscaling.{k}": [f"Unknown field. autoscaling takes: {takes}."] for k in unknown})
        scaling = PoolScaling.objects.filter(pool=pool).first()
        data = {"pool": pool.pk, **wanted}
        serializer = PoolScalingSerializer(scaling, data=data, partial=scaling is not None,
                                           context={"request": ctx.request})  # fmt: skip
        if not serializer.is_valid():
            raise Invalid(spec_errors(serializer.errors, "spec.autoscaling"))
        validated = {k: v for k, v in serializer.validated_data.items() if k in SCALING_FIELDS}
        return validated

    def delete(self, obj: Any, ctx: Context) -> None:
        _unwrapped(elastic.do_disable)(PoolScaling.objects.get(pool=obj), **ctx.action_kwargs())


def _unwrapped(action: Callable[..., Any]) -> Callable[..., Any]:
    """A durable action's body, to run inside the one transaction of an apply (``durable`` keeps an
    action from being nested by accident; here it is nested on purpose, so that nothing is applied
    unless everything is)."""
    return getattr(action, "__wrapped__", action)


class AlertRuleKind(SerializerKind):
    """An alert rule, by its name. Its webhook's shared secret is never in the document: the CLI
    reads it from the environment variable ``webhook_secret_from.env`` names and sends it as
    ``webhook_secret``; the portal keeps it and never answers it."""

    kind = "AlertRule"
    model = AlertRule
    serializer = AlertRuleSerializer
    fields = ("kind", "workspace", "gpu_type", "threshold", "window_s", "for_s", "enabled", "emails", "webhook_url")

    def objects(self) -> Iterable[Any]:
        from apps.workspaces.models import Workspace

        shared = AlertRule.objects.exclude(workspace__kind=Workspace.Kind.PRIVATE)
        return shared.select_related("workspace").order_by("name", "id")

    def find(self, name: str) -> Any | None:
        found = list(self.objects().filter(name=name)[:2])  # type: ignore[attr-defined]
        if len(found) > 1:
            raise Invalid({"metadata.name": [f"More than one alert rule is named {name}: rename one of them first."]})
        return found[0] if found else None

    def spec_of(self, obj: Any, ctx: Context) -> dict[str, Any]:
        spec = self.represent(obj, ctx)
        if obj.webhook_secret:
            spec["webhook_secret_from"] = {"env": secret_variable(obj.name)}
        return spec

    def prepare(self, obj: Any | None, name: str, spec: dict[str, Any], ctx: Context) -> Prepared:
        spec = dict(spec)
        if "webhook_secret_from" in spec:
            raise Invalid({"spec.webhook_secret_from": [
                "The CLI reads the secret from this environment variable and sends it as webhook_secret; "
                "send webhook_secret to the API itself."]})  # fmt: skip
        secret = spec.pop("webhook_secret", None)
        if secret is not None and not isinstance(secret, str):
            raise Invalid({"spec.webhook_secret": ["Expected a string."]})
        given = {**spec, **({} if secret is None else {"webhook_secret": secret})}
        validated, shown = self.validate(obj, name, given, ctx, extra=("webhook_secret",))
        secret = validated.pop("webhook_secret", None)
        changes = diff(None if obj is None else self.represent(obj, ctx), shown)
        if secret is not None and (obj is None or secret != obj.webhook_secret):
            changes.append({"field": "spec.webhook_secret", "from": None, "to": "(secret)"})
        if obj is not None and not changes:
            return Prepared([], lambda: None)
        fields = {k: v for k, v in validated.items() if k != "name" or obj is None}
        return Prepared(changes, lambda: self.save_rule(obj, fields, secret, ctx))

    def save_rule(self, obj: Any | None, fields: dict[str, Any], secret: str | None, ctx: Context) -> None:
        alerts.do_save_rule(obj, webhook_secret=secret, **fields, **ctx.action_kwargs())

    def delete(self, obj: Any, ctx: Context) -> None:
        alerts.do_delete_rule(obj, **ctx.action_kwargs())


def secret_variable(name: str) -> str:
    """The environment variable an exported rule's webhook secret is read from."""
    clean = "".join(c if c.isalnum() else "_" for c in name.upper()).strip("_")
    return f"GPUPORTAL_WEBHOOK_SECRET_{clean or 'RULE'}"
