from typing import Any

from django.contrib.auth.models import User
from django.contrib.auth.signals import user_logged_in, user_login_failed
from django.db.models.signals import post_save, pre_save
from django.dispatch import receiver
from django.http import HttpRequest

from apps.accounts.api_tokens import revoke_all
from apps.accounts.models import DeviceLogin
from apps.audit.actions import SYSTEM, Origin, do_log_event, do_log_failed_sign_in
from apps.audit.events import Event
from apps.audit.models import AuditEvent
from apps.workspaces.actions import ensure_private_workspace


@receiver(user_logged_in)
def give_private_workspace(sender: Any, user: Any, **kwargs: Any) -> None:
    ensure_private_workspace(user)


def _origin(request: HttpRequest | None) -> Origin:
    if request is None:
        return SYSTEM
    api = request.path.startswith("/api/")
    return Origin.from_request(request, via=AuditEvent.Via.API if api else AuditEvent.Via.WEB)


@receiver(user_logged_in)
def log_sign_in(sender: Any, request: HttpRequest | None, user: Any, **kwargs: Any) -> None:
    """A session sign-in (the token endpoint logs its own: it makes no session)."""
    do_log_event(Event.SIGN_IN, user, acting_user=user, origin=_origin(request))


@receiver(user_login_failed)
def log_failed_sign_in(
    sender: Any, credentials: dict[str, Any], request: HttpRequest | None = None, **kwargs: Any
) -> None:
    do_log_failed_sign_in(str(credentials.get("username") or ""), origin=_origin(request))


@receiver(pre_save, sender=User)
def note_credentials_change(sender: Any, instance: Any, **kwargs: Any) -> None:
    """Whether this save changes the user's password or deactivates them: their tokens then end,
    with the reason the saver gave (`_credentials_change_reason`), or the change's own."""
    instance._tokens_end = ""
    if instance.pk is None or kwargs.get("raw"):
        return
    fields = kwargs.get("update_fields")
    if fields is not None and not {"password", "is_active"} & set(fields):
        return  # e.g. the last sign-in's time, written at every sign-in: no need to look
    before = User.objects.filter(pk=instance.pk).values("password", "is_active").first()
    if before is None:
        return
    if before["is_active"] and not instance.is_active:
        instance._tokens_end = "the user was deactivated"
    elif before["password"] != instance.password:
        instance._tokens_end = getattr(instance, "_credentials_change_reason", "") or "the password was changed"


@receiver(post_save, sender=User)
def end_tokens(sender: Any, instance: Any, **kwargs: Any) -> None:
    """Changing a password or deactivating a user revokes every one of their personal tokens and
    refuses the CLI sign-ins they allowed whose token was not yet collected (Django ends their
    sessions: a session holds a hash of the password, and an inactive user has none; the credential
    stamp, apps/accounts/stamps.py, ends their notebooks' sign-ins and their workloads' tokens)."""
    reason = getattr(instance, "_tokens_end", "")
    if reason:
        instance._tokens_end = ""
        revoke_all(instance, reason=reason)
        DeviceLogin.objects.filter(user=instance, collected_at__isnull=True).update(approved=False)
