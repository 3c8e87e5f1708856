"""Compute, notebook and inference profiles: create, edit, publish, unpublish, and who sees each."""

from __future__ import annotations

import shlex
from typing import Any

from django.contrib import messages
from django.contrib.auth.models import Group
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect
from django.views.decorators.http import require_POST

from apps.catalog import actions
from apps.catalog.api import ComputeProfileSerializer, NotebookProfileSerializer
from apps.catalog.models import ComputeProfile, InferenceProfile, NotebookProfile
from apps.console.forms import form_data, save
from apps.inference.api import InferenceProfileSerializer
from apps.web.common import action_kwargs, admin_only, page

KINDS: dict[str, dict[str, Any]] = {
    "compute": {
        "model": ComputeProfile,
        "serializer": ComputeProfileSerializer,
        "text": ("name", "display_name", "description", "kind", "gpu_type", "gpu_count", "cpu_cores", "memory_gb"),
        "label": "compute profile",
    },
    "notebook": {
        "model": NotebookProfile,
        "serializer": NotebookProfileSerializer,
        "text": ("name", "display_name", "description", "image"),
        "label": "notebook profile",
    },
    "inference": {
        "model": InferenceProfile,
        "serializer": InferenceProfileSerializer,
        "text": (
            "name",
            "display_name",
            "description",
            "server",
            "image",
            "gpu_type",
            "gpus",
            "cpu_cores",
            "memory_gb",
            "concurrency",
            "scale_up_after_s",
            "scale_down_after_s",
        ),  # fmt: skip
        "label": "inference profile",
        "template": "console/inference_profile_form.html",
    },
}


def _kind(kind: str) -> dict[str, Any]:
    if kind not in KINDS:
        raise Http404("No such kind of profile.")
    return KINDS[kind]


@admin_only
def profile_list(request: HttpRequest) -> HttpResponse:
    context = {
        "compute": ComputeProfile.objects.prefetch_related("visible_to").order_by("-published", "gpu_count", "name"),
        "notebook": NotebookProfile.objects.prefetch_related("visible_to").order_by("-published", "name"),
        "inference": InferenceProfile.objects.prefetch_related("visible_to").order_by("-published", "gpus", "name"),
        "live_workspaces": [],
    }
    return page(request, "console/profiles.html", context)


def _values(profile: Any, spec: dict[str, Any]) -> dict[str, Any]:
    values = {name: getattr(profile, name, "") for name in spec["text"]}
    values["published"] = profile.published
    values["visible_to"] = [g.name for g in profile.visible_to.all()] if profile.pk else []
    if isinstance(profile, NotebookProfile):
        values["python_packages"] = "\n".join(profile.python_packages)
    if isinstance(profile, InferenceProfile):
        values["server_args"] = _arg_lines(profile.server_args)
    return values


@admin_only
def profile_edit(request: HttpRequest, kind: str, name: str | None = None) -> HttpResponse:
    """Create a profile (no name in the URL) or change one."""
    spec = _kind(kind)
    profile = get_object_or_404(spec["model"], name=name) if name else spec["model"]()
    errors: dict[str, list[str]] = {}
    values = _values(profile, spec)
    if request.method == "POST":
        data = form_data(request, spec["text"], lists=("visible_to",), flags=("published",))
        if kind == "notebook":
            data["python_packages"] = _lines(request.POST.get("python_packages", ""))
        if kind == "inference":
            data["server_args"] = _args(request.POST.get("server_args", ""), errors)
            data["gpu_type"] = request.POST.get("gpu_type", "").strip()  # none: a CPU profile
        values = {
            **values,
            **{k: request.POST.get(k, "") for k in spec["text"]},
            "published": data["published"],
            "visible_to": data["visible_to"],
            "python_packages": request.POST.get("python_packages", ""),
            "server_args": request.POST.get("server_args", ""),
        }

        def perform(checked: dict[str, Any]) -> Any:
            return actions.do_save_profile(profile, **checked, **action_kwargs(request))

        saved = None
        if not errors:  # the server's arguments could be read
            saved, errors = save(
                request,
                spec["serializer"],
                data,
                perform,
                instance=profile if profile.pk else None,
                fields={*spec["text"], "visible_to", "python_packages", "server_args", "published"},
            )
        if saved is not None:
            messages.success(request, f"Profile {saved.name} saved{' and published' if saved.published else ''}.")
            return redirect("console:profiles")
    context = {
        "kind": kind,
        "label": spec["label"],
        "profile": profile,
        "values": values,
        "errors": errors,
        "groups": Group.objects.order_by("name"),
        "kinds": ComputeProfile.Kind.choices,
        "servers": InferenceProfile.Server.choices,
        "live_workspaces": [],
    }
    template = spec.get("template", "console/profile_form.html")
    return page(request, template, context, status=400 if errors else 200)


def _lines(text: str) -> list[str]:
    """A textarea's lines, one value each (a package), blank ones left out."""
    return [line.strip() for line in text.splitlines() if line.strip()]


def _args(text: str, errors: dict[str, list[str]]) -> list[str]:
    """A server's extra arguments as a shell would split them (``--max-model-len 2048``)."""
    try:
        return shlex.split(text)
    except ValueError as exc:  # an unclosed quote
        errors["server_args"] = [f"Write them as on a command line: {exc}."]
        return []


def _arg_lines(args: list[str]) -> str:
    """Arguments for the form: each option on a line of its own, with its values."""
    lines: list[list[str]] = []
    for arg in args:
        if arg.startswith("-") or not lines:
            lines.append([])
        lines[-1].append(shlex.quote(arg))
    return "\n".join(" ".join(line) for line in lines)


@admin_only
@require_POST
def profile_publish(request: HttpRequest, kind: str, name: str) -> HttpResponse:
    """Publish or unpublish: users see a published profile at once."""
    spec = _kind(kind)
    profile = get_object_or_404(spec["model"], name=name)
    published = request.POST.get("published") == "true"
    actions.do_save_profile(profile, published=published, **action_kwargs(request))
    messages.success(request, f"Profile {profile.name} is {'published' if published else 'unpublished'}.")
    return redirect("console:profiles")
