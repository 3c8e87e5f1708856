"""The API's one error shape, and the mapping of every error to it.

Every error the API returns looks like:
    {"error": {"status": 400, "code": "invalid", "message": "...", "fields": {"name": ["..."]},
               "field_codes": {"name": ["max_length"]}}}
`field_codes` gives, for each message of `fields`, a code a program can test (DRF's and Django's
validation codes, such as "required", "does_not_exist", "unique", "max_length"; "rule" for a
refusal by a rule that spans fields or reads the portal's state).

The errors actions raise live in apps/errors.py, which knows nothing of DRF; here they become
responses, as do DRF's and Django's own.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.exceptions import PermissionDenied, RequestDataTooBig
from django.core.exceptions import ValidationError as DjangoValidationError
from django.http import Http404
from rest_framework import exceptions
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from apps.errors import RULE, ActionError, TooMany


def _flatten(detail: Any, prefix: str = "") -> dict[str, list[str]]:
    """DRF's nested error detail as {"field.sub": [messages]}."""
    key = prefix or "non_field_errors"
    if isinstance(detail, dict):
        items = [(f"{prefix}.{k}" if prefix else str(k), v) for k, v in detail.items()]
    elif isinstance(detail, list) and any(isinstance(item, (dict, list)) for item in detail):
        items = [(f"{prefix}.{i}" if prefix else str(i), v) for i, v in enumerate(detail)]
    else:
        return {key: [str(item) for item in detail] if isinstance(detail, list) else [str(detail)]}
    out: dict[str, list[str]] = {}
    for name, value in items:
        for field, messages in _flatten(value, name).items():
            out.setdefault(field, []).extend(messages)
    return out


def _body(
    status_code: int,
    code: str,
    message: str,
    fields: dict[str, list[str]] | None = None,
    field_codes: dict[str, list[str]] | None = None,
) -> dict[str, Any]:
    error: dict[str, Any] = {"status": status_code, "code": code, "message": message}
    if fields:
        error["fields"] = fields
    if field_codes:
        error["field_codes"] = field_codes
    return {"error": error}


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, ActionError):
        fields = {exc.field: [exc.message]} if exc.field else None
        codes = {exc.field: [RULE]} if exc.field else None
        status_code = int(exc.status_code)
        response = Response(_body(status_code, exc.code, exc.message, fields, codes), status=status_code)
        if isinstance(exc, TooMany):
            response["Retry-After"] = str(exc.retry_after)
        return response
    if isinstance(exc, DjangoValidationError):
        exc = exceptions.ValidationError(exc.message_dict if hasattr(exc, "error_dict") else exc.messages)
    if isinstance(exc, RequestDataTooBig):  # Django's own limit, met before the parser's
        exc = exceptions.ParseError(f"The body is larger than {settings.DATA_UPLOAD_MAX_MEMORY_SIZE // 1024} KiB.")
    if isinstance(exc, Http404):
        exc = exceptions.NotFound()
    elif isinstance(exc, PermissionDenied):
        exc = exceptions.PermissionDenied()
    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    if isinstance(exc, exceptions.ValidationError):
        fields = _flatten(exc.detail) or {"non_field_errors": ["Invalid input."]}
        first = next(iter(fields.items()))
        message = first[1][0] if first[0] == "non_field_errors" else f"{first[0]}: {first[1][0]}"
        codes = _flatten(exc.get_codes())
        response.data = _body(response.status_code, "invalid", message, fields, codes)
    else:
        detail = exc.detail if isinstance(exc, exceptions.APIException) else str(exc)
        code = exc.get_codes() if isinstance(exc, exceptions.APIException) else "error"
        response.data = _body(response.status_code, str(code), str(detail))
    return response
