"""Compute and notebook profiles: create, edit, publish, unpublish, and who sees each."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth.models import Group
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect
from django.views.decorators.http import require_POST

from apps.catalog import actions
from apps.catalog.api import ComputeProfileSerializer, NotebookProfileSerializer
from apps.catalog.models import ComputeProfile, NotebookProfile
from apps.console.forms import form_data, save
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
        "live_workspaces": [],
    }
    return page(request, "console/profiles.html", context)


def _values(profile: Any, spec: dict[str, Any]) -> dict[str, Any]:
    values = {name: getattr(profile, name, "") for name in spec["text"]}
    values["published"] = profile.published
    values["visible_to"] = [g.name for g in profile.visible_to.all()] if profile.pk else []
    if isinstance(profile, NotebookProfile):
        values["python_packages"] = "\n".join(profile.python_packages)
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
            data["python_packages"] = [
                p.strip() for p in request.POST.get("python_packages", "").splitlines() if p.strip()
            ]
        values = {
            **values,
            **{k: request.POST.get(k, "") for k in spec["text"]},
            "published": data["published"],
            "visible_to": data["visible_to"],
            "python_packages": request.POST.get("python_packages", ""),
        }

        def perform(checked: dict[str, Any]) -> Any:
            return actions.do_save_profile(profile, **checked, **action_kwargs(request))

        saved, errors = save(
            request,
            spec["serializer"],
            data,
            perform,
            instance=profile if profile.pk else None,
            fields={*spec["text"], "visible_to", "python_packages", "published"},
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
        "live_workspaces": [],
    }
    return page(request, "console/profile_form.html", context, status=400 if errors else 200)


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
