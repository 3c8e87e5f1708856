"""Accounts are Django's own users and groups. The one model here is how a workload's token
presents its user to the API (apps/accounts/tokens.py)."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import User


class WorkloadUser(User):
    """A user as a notebook's, instance's or job's own token presents them: acting for them in one
    workspace alone (``workspace_scope``), with the role they hold there, and never as a platform
    admin (``is_staff`` and ``is_superuser`` are off, so no admin endpoint lets it in). A platform
    admin's token acts as an owner of that one workspace (``owner_in_scope``).

    Built for each request from the user's row, and never saved: its flags are not the user's."""

    workspace_scope: int
    owner_in_scope: bool
    workload: str

    class Meta:
        proxy = True

    @classmethod
    def acting_for(cls, user: User, *, workspace_id: int, workload: str) -> WorkloadUser:
        scoped = cls(**{field.attname: getattr(user, field.attname) for field in User._meta.concrete_fields})
        scoped._state.adding = False
        scoped._state.db = user._state.db
        scoped.owner_in_scope = bool(user.is_staff)
        scoped.is_staff = scoped.is_superuser = False
        scoped.workspace_scope = workspace_id
        scoped.workload = workload
        return scoped

    def save(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("a workload's view of a user is never saved: change the user itself")
