"""Saving a console form: parse it with the API's serializer, change state with the app's action.

A refusal from either comes back as messages keyed by field, shown next to the field.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.core.exceptions import ValidationError
from django.http import HttpRequest
from rest_framework import serializers

from apps.errors import ActionError
from apps.web.common import Errors, refused, serializer_context, validated


def form_data(
    request: HttpRequest,
    text: tuple[str, ...],
    *,
    lists: tuple[str, ...] = (),
    flags: tuple[str, ...] = (),
    nullable: tuple[str, ...] = (),
) -> dict[str, Any]:
    """The POSTed form as the API's JSON body would carry it.

    Empty text fields are left out (the serializer's default applies), except `nullable` ones,
    which become null; checkboxes are true or false; multi-selects are lists.
    """
    data: dict[str, Any] = {}
    for name in text:
        value = request.POST.get(name, "").strip()
        if value:
            data[name] = value
        elif name in nullable:
            data[name] = None
    for name in lists:
        data[name] = [v for v in request.POST.getlist(name) if v]
    for name in flags:
        data[name] = request.POST.get(name) == "on"
    return data


def save(
    request: HttpRequest,
    serializer_class: type[serializers.Serializer],
    data: dict[str, Any],
    perform: Callable[[dict[str, Any]], Any],
    *,
    instance: Any = None,
    fields: set[str],
) -> tuple[Any, Errors]:
    """Validate `data` as the API would, then call `perform(validated_data)` (the action)."""
    errors: Errors = {}
    serializer = serializer_class(
        instance, data=data, partial=instance is not None, context=serializer_context(request)
    )
    checked = validated(serializer, errors)
    if checked is None:
        return None, errors
    try:
        return perform(checked), errors
    except ActionError as exc:
        refused(exc, errors, fields)
    except ValidationError as exc:  # a model's own check (full_clean) inside the action
        for field, messages in exc.message_dict.items():
            errors.setdefault(field if field in fields else "form", []).extend(messages)
    return None, errors
