"""Typed errors. Every error the portal returns becomes one of these, carrying its message.

The portal answers every error in one shape:
    {"error": {"status": 400, "code": "invalid", "message": "...", "fields": {"name": ["..."]}}}
"""

from __future__ import annotations

from typing import Any


class GPUPortalError(Exception):
    """Base of every error this package raises."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ConfigError(GPUPortalError):
    """No portal URL or token could be found, or the configuration file is unreadable."""


class SpecError(GPUPortalError):
    """A job spec that cannot be sent: a wrong type, an unknown field, a missing script file."""

    def __init__(self, message: str, *, field: str | None = None, source: str | None = None) -> None:
        self.field = field
        self.source = source
        text = f"{field}: {message}" if field else message
        super().__init__(f"{source}: {text}" if source else text)
        self.reason = message


class PortalUnreachable(GPUPortalError):
    """The portal did not answer (connection refused, DNS, timeout)."""


class WaitTimeout(GPUPortalError, TimeoutError):
    """A wait ran out of time before the object reached the state waited for."""

    def __init__(self, message: str, obj: Any = None) -> None:
        super().__init__(message)
        self.obj = obj


class WorkloadFailed(GPUPortalError):
    """An instance or notebook waited for ended in FAILED (or was deleted) instead of becoming ready;
    a job waited for with ``check=True`` did not succeed."""

    def __init__(self, message: str, obj: Any = None) -> None:
        super().__init__(message)
        self.obj = obj


class ArtifactError(GPUPortalError):
    """A downloaded artifact does not match the size or sha256 the portal recorded."""


class APIError(GPUPortalError):
    """The portal refused a request. ``status``, ``code``, ``message`` and ``fields`` are the API's."""

    def __init__(
        self, message: str, *, status: int, code: str = "error", fields: dict[str, list[str]] | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.fields = fields or {}

    def __repr__(self) -> str:
        return f"{type(self).__name__}(status={self.status}, code={self.code!r}, message={self.message!r})"


class ValidationError(APIError):
    """400: a field failed validation (``fields`` names it) or the body was malformed."""


class AuthenticationError(APIError):
    """401: no token, a wrong token, or a wrong username or password."""


class PermissionDenied(APIError):
    """403: your role does not allow this."""


class NotFound(APIError):
    """404: no such object, or one you cannot see."""


class Conflict(APIError):
    """409: the object's state does not allow this (cancelling a finished job)."""


class LimitExceeded(Conflict):
    """409: a hard limit of the workspace (max instances, a size it can never hold)."""


class ServerError(APIError):
    """5xx: the portal failed; the request may be retried."""


def error_for(status: int, body: Any, fallback_text: str = "") -> APIError:
    """The typed error for an HTTP error answer, from the API's error shape where there is one."""
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        message = str(error.get("message") or f"HTTP {status}")
        code = str(error.get("code") or "error")
        raw_fields = error.get("fields")
        fields = (
            {str(k): [str(m) for m in v] if isinstance(v, list) else [str(v)] for k, v in raw_fields.items()}
            if isinstance(raw_fields, dict)
            else None
        )
    else:
        text = " ".join(fallback_text.split())[:200]
        if text.startswith("<"):  # an HTML page: not the portal's API answering
            text = "the answer is not the portal API's (is the URL a GPU Portal?)"
        message = f"HTTP {status}" + (f": {text}" if text else "")
        code, fields = "error", None
    cls: type[APIError]
    if code in ("not_authenticated", "authentication_failed"):  # 403 where no auth scheme is offered
        cls = AuthenticationError
    elif status == 400:
        cls = ValidationError
    elif status == 401:
        cls = AuthenticationError
    elif status == 403:
        cls = PermissionDenied
    elif status == 404:
        cls = NotFound
    elif status == 409:
        cls = LimitExceeded if code == "limit_exceeded" else Conflict
    elif status >= 500:
        cls = ServerError
    else:
        cls = APIError
    return cls(message, status=status, code=code, fields=fields)
