from typing import Any

from django.contrib.auth.signals import user_logged_in
from django.dispatch import receiver

from apps.workspaces.actions import ensure_private_workspace


@receiver(user_logged_in)
def give_private_workspace(sender: Any, user: Any, **kwargs: Any) -> None:
    ensure_private_workspace(user)
