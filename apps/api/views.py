"""Base classes every API viewset builds on: the access layer, actions, the audit origin."""

from __future__ import annotations

from typing import Any

from django.db.models import Model, QuerySet
from rest_framework import permissions, viewsets
from rest_framework.exceptions import PermissionDenied

from apps.audit.actions import Origin
from apps.workspaces.access import CHANGE, VIEW, can, may, restrict
from apps.workspaces.models import Workspace


class IsAdminOrReadOnly(permissions.BasePermission):
    message = "Only platform admins can change this."

    def has_permission(self, request: Any, view: Any) -> bool:
        if not (request.user and request.user.is_authenticated):
            return False
        return request.method in permissions.SAFE_METHODS or request.user.is_staff


class IsPlatformAdmin(permissions.BasePermission):
    message = "Only platform admins can do this."

    def has_permission(self, request: Any, view: Any) -> bool:
        return bool(request.user and request.user.is_authenticated and request.user.is_staff)


class PortalViewSet(viewsets.ModelViewSet):
    """A viewset whose writes go through actions. Subclasses implement the perform_* hooks."""

    http_method_names = ["get", "post", "patch", "delete", "head", "options"]

    @property
    def origin(self) -> Origin:
        return Origin.from_request(self.request)

    def action_kwargs(self) -> dict[str, Any]:
        return {"acting_user": self.request.user, "origin": self.origin}


class TenantViewSet(PortalViewSet):
    """Tenant data: every queryset passes through `restrict()`; writes need a member's role."""

    workspace_field = "workspace"
    # Role needed to change an object; viewers may only read.
    change_role = CHANGE
    # Or the role needed on the object itself, for objects that may be shared with a collaborator
    # (apps/workspaces/access.py): then that, not `change_role` in its workspace.
    object_role: str | None = None

    def base_queryset(self) -> QuerySet[Any]:
        return self.queryset.all()  # type: ignore[union-attr]

    def get_queryset(self) -> QuerySet[Any]:
        return restrict(self.base_queryset(), self.request.user, VIEW, field=self.workspace_field)

    def workspace_of(self, obj: Model) -> Workspace:
        for part in self.workspace_field.split("__"):
            obj = getattr(obj, part)
        assert isinstance(obj, Workspace)
        return obj

    def require(self, workspace: Workspace, role: str | None = None) -> None:
        role = role or self.change_role
        if not can(self.request.user, workspace, role):
            raise PermissionDenied(f"Your role in workspace {workspace.name} does not allow this.")

    def require_on(self, obj: Model, role: str) -> None:
        """`role` on this one object (which may be shared with a collaborator), or a 403."""
        if not may(self.request.user, obj, role):
            raise PermissionDenied(f"Your access to {obj} does not allow this.")

    def check_object_permissions(self, request: Any, obj: Model) -> None:
        super().check_object_permissions(request, obj)
        if request.method not in permissions.SAFE_METHODS:
            if self.object_role is not None:
                self.require_on(obj, self.object_role)
            else:
                self.require(self.workspace_of(obj))
