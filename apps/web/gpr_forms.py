"""The forms of GPU provisioning requests, read into the terms ``check_request`` takes: the new
request's form (and its as-you-type estimate, which reads the same fields), the change of a
request's size or length, and the console's approval.

A field the form cannot read (not a number, no such cluster) is refused here, beside that field;
what the portal refuses about the terms themselves (too many GPUs, too long, a start in the past) is
the action's ``ActionError``, which names its field too.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.db.models import QuerySet

from apps.inventory.models import GPU, Cluster
from apps.provisioning.models import MAX_GPUS
from apps.web.common import Errors
from apps.workspaces.models import Workspace

FIELDS = ("gpu_type", "gpus", "cluster", "start", "start_at", "duration", "unit", "priority", "justification")
DEFAULTS = {"gpus": "1", "start": "asap", "duration": "8", "unit": "hours", "priority": "0"}
UNITS = {"hours": 3600, "days": 86400}
# What the form's <input type="datetime-local"> sends: the portal's time, UTC (settings.TIME_ZONE).
LOCAL_FORMATS = ("%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S")


@dataclass(frozen=True)
class Terms:
    """A request's terms as the form gives them: `check_request`'s keywords and `do_request`'s."""

    gpu_type: str
    gpus: int
    cluster: Cluster | None
    start_at: datetime | None  # None: as soon as possible
    duration_s: int
    priority: int
    justification: str

    def asked(self) -> dict[str, Any]:
        return {
            "gpu_type": self.gpu_type, "gpus": self.gpus, "cluster": self.cluster, "start_at": self.start_at,
            "duration_s": self.duration_s,
        }  # fmt: skip


def gpu_clusters() -> QuerySet[Cluster]:
    """The enabled clusters that have GPUs, the default first."""
    with_gpus = GPU.objects.values("node__pool__cluster")
    return Cluster.objects.filter(enabled=True, pk__in=with_gpus).order_by("-is_default", "name")


def gpu_types_for(workspace: Workspace) -> list[str]:
    """The GPU types an enabled cluster has and the workspace may use, by name."""
    found = GPU.objects.filter(node__pool__cluster__enabled=True).values_list("gpu_type", flat=True).distinct()
    return sorted(t for t in set(found) if workspace.allows_gpu_type(t))


def whole(value: str, field: str, errors: Errors, *, low: int, high: int, what: str) -> int | None:
    """A whole number between `low` and `high`, or None with the field's error."""
    try:
        number = int(value.strip())
    except ValueError:
        errors.setdefault(field, []).append(f"Give {what} as a whole number.")
        return None
    if not low <= number <= high:
        errors.setdefault(field, []).append(f"Give {what} between {low} and {high}.")
        return None
    return number


def gpu_count(value: str, errors: Errors) -> int | None:
    """The GPUs asked for, or None with the field's error."""
    return whole(value, "gpus", errors, low=1, high=MAX_GPUS, what="the number of GPUs")


def duration_of(post: Any, errors: Errors, field: str = "duration") -> int | None:
    """The duration in seconds from a number and its unit (hours or days); fractions allowed."""
    unit = UNITS.get(post.get("unit", "hours"), 3600)
    try:
        amount = float(post.get(field, "").strip())
    except ValueError:
        errors.setdefault(field, []).append("Give the duration as a number of hours or days.")
        return None
    if not 0 < amount <= 366 * 86400 / unit:
        errors.setdefault(field, []).append("Give a duration of at least ten minutes and at most a year.")
        return None
    return round(amount * unit)


def start_of(post: Any, errors: Errors) -> datetime | None:
    """The start asked for (UTC), or None for "as soon as possible" and for one the form cannot read
    (then with the field's error)."""
    if post.get("start", "asap") != "at":
        return None
    text = post.get("start_at", "").strip()
    for pattern in LOCAL_FORMATS:
        try:
            return datetime.strptime(text, pattern).replace(tzinfo=UTC)
        except ValueError:
            continue
    errors.setdefault("start_at", []).append("Give the start as a date and a time (UTC), or start as soon as possible.")
    return None


def cluster_of(post: Any, errors: Errors) -> Cluster | None:
    name = post.get("cluster", "").strip()
    if not name:
        return None
    cluster = gpu_clusters().filter(name=name).first()
    if cluster is None:
        errors.setdefault("cluster", []).append(f"No cluster named {name} has GPUs.")
    return cluster


def read_terms(post: Any, workspace: Workspace, errors: Errors, *, justified: bool = True) -> Terms | None:
    """The new request's terms from the form (`post`: its fields), or None with every field's error
    in `errors`. The estimate reads them without a justification (`justified` False)."""
    gpu_type = post.get("gpu_type", "").strip()
    if not gpu_type:
        errors.setdefault("gpu_type", []).append("Choose a GPU type.")
    gpus = gpu_count(post.get("gpus", ""), errors)
    cluster = cluster_of(post, errors)
    start_at = start_of(post, errors)
    duration_s = duration_of(post, errors)
    priority = whole(post.get("priority", "0") or "0", "priority", errors, low=-100, high=100, what="the priority")
    justification = post.get("justification", "").strip()
    if justified and not justification:
        errors.setdefault("justification", []).append("Say what the GPUs are for: an admin may read it.")
    elif len(justification) > 2000:
        errors.setdefault("justification", []).append("At most 2000 characters.")
    if errors or gpus is None or duration_s is None or priority is None:
        return None
    return Terms(gpu_type, gpus, cluster, start_at, duration_s, priority, justification)


def local_input(moment: datetime | None) -> str:
    """A moment as a datetime-local input's value (UTC, to the minute)."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M") if moment else ""


def duration_fields(seconds: int) -> dict[str, str]:
    """A duration as the form's number and unit: whole days in days, the rest in hours."""
    if seconds % 86400 == 0:
        return {"duration": str(seconds // 86400), "unit": "days"}
    return {"duration": f"{seconds / 3600:g}", "unit": "hours"}


def later_start(post: Any, errors: Errors) -> datetime | None:
    """The console's "not before" of an approval: blank for the start asked for."""
    if not post.get("start_at", "").strip():
        return None
    return start_of({"start": "at", "start_at": post.get("start_at", "")}, errors)
