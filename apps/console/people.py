"""Users and groups: create, change groups and admin rights, deactivate; groups and their members."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.paginator import Paginator
from django.db.models import Count, Prefetch
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect
from django.views.decorators.http import require_POST

from apps.accounts import actions
from apps.accounts.api import GroupSerializer, UserSerializer
from apps.console.forms import form_data, save
from apps.errors import ActionError
from apps.web.common import action_kwargs, admin_only, page
from apps.workspaces.models import Workspace

User = get_user_model()
TEXT = ("username", "email", "first_name", "last_name", "password")
FIELDS = {*TEXT, "groups", "is_staff", "is_active"}


@admin_only
def people(request: HttpRequest) -> HttpResponse:
    users = User.objects.prefetch_related(Prefetch("groups", queryset=Group.objects.order_by("name"))).order_by(
        "-is_active", "username"
    )
    groups = Group.objects.annotate(members=Count("user")).order_by("name")
    assigned = {
        group_id: name
        for group_id, name in Workspace.objects.filter(assigned_group__isnull=False).values_list(
            "assigned_group_id", "name"
        )
    }
    context = {
        "page_obj": Paginator(users, 100).get_page(request.GET.get("page")),
        "groups": [(g, assigned.get(g.pk)) for g in groups],
        "group_errors": {},
        "live_workspaces": [],
    }
    return page(request, "console/people.html", context)


@admin_only
def user_edit(request: HttpRequest, username: str | None = None) -> HttpResponse:
    """Create a user with a password (no username in the URL) or change one."""
    user = get_object_or_404(User, username=username) if username else User()
    errors: dict[str, list[str]] = {}
    values: dict[str, Any] = {name: getattr(user, name, "") for name in TEXT if name != "password"}
    values.update(
        groups=[g.name for g in user.groups.all()] if user.pk else [],
        is_staff=user.is_staff,
        is_active=user.is_active if user.pk else True,
    )
    if request.method == "POST":
        data = form_data(request, TEXT, lists=("groups",), flags=("is_staff", "is_active"))
        values = {
            **{k: request.POST.get(k, "") for k in TEXT if k != "password"},
            "groups": data["groups"],
            "is_staff": data["is_staff"],
            "is_active": data["is_active"],
        }

        def perform(checked: dict[str, Any]) -> Any:
            return actions.do_save_user(user, **checked, **action_kwargs(request))

        saved, errors = save(request, UserSerializer, data, perform, instance=user if user.pk else None, fields=FIELDS)
        if saved is not None:
            messages.success(request, f"User {saved.get_username()} saved.")
            return redirect("console:people")
    context = {
        "editing": user,
        "values": values,
        "errors": errors,
        "groups": Group.objects.order_by("name"),
        "live_workspaces": [],
    }
    return page(request, "console/user_form.html", context, status=400 if errors else 200)


@admin_only
@require_POST
def user_deactivate(request: HttpRequest, username: str) -> HttpResponse:
    user = get_object_or_404(User, username=username)
    try:
        actions.do_deactivate_user(user, **action_kwargs(request))
    except ActionError as exc:
        messages.error(request, exc.message)
    else:
        messages.success(request, f"User {username} deactivated: they can no longer sign in.")
    return redirect("console:people")


@admin_only
@require_POST
def group_create(request: HttpRequest) -> HttpResponse:
    data = form_data(request, ("name",))
    saved, errors = save(
        request,
        GroupSerializer,
        data,
        lambda checked: actions.do_save_group(Group(), **checked, **action_kwargs(request)),
        fields={"name"},
    )
    if saved is not None:
        messages.success(request, f"Group {saved.name} created.")
    else:
        messages.error(request, "The group was not created. " + " ".join(m for v in errors.values() for m in v))
    return redirect("console:people")


@admin_only
@require_POST
def group_delete(request: HttpRequest, name: str) -> HttpResponse:
    group = get_object_or_404(Group, name=name)
    try:
        actions.do_delete_group(group, **action_kwargs(request))
    except ActionError as exc:
        messages.error(request, exc.message)
    else:
        messages.success(request, f"Group {name} deleted.")
    return redirect("console:people")
