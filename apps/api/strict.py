"""Request bodies take the JSON types the schema states, and nothing DRF would coerce into them:
``0`` is not the string ``"0"``, ``"1"`` is not the integer 1, ``1`` is not ``true``. A decimal
(GPU counts, quotas) is a string such as ``"0.5"``, as the API also answers it.

The check runs on the body before the fields read it, so each field keeps its own validation.
Query parameters are strings by nature and are not checked here."""

from __future__ import annotations

import re
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from drf_spectacular.extensions import OpenApiSerializerFieldExtension
from rest_framework import serializers
from rest_framework.relations import ManyRelatedField, PrimaryKeyRelatedField, RelatedField
from rest_framework.request import Request

from apps.scheduling.types import SHARES_TEXT, gpu_shape_problem

_WORDS = {str: "a string", bool: "true or false", int: "a whole number", dict: "an object", list: "a list"}


def _up_to(top: int) -> str:
    """A regular expression for the whole numbers 0..top written without leading zeros."""
    if top < 0:
        return "(?!)"
    digits = str(top)
    alternatives = ["0"] + [rf"[1-9]\d{{{n - 1}}}" if n > 1 else "[1-9]" for n in range(1, len(digits))]
    for i, digit in enumerate(digits):
        low = 1 if i == 0 else 0
        if int(digit) > low:
            rest = len(digits) - i - 1
            alternatives.append(digits[:i] + f"[{low}-{int(digit) - 1}]" + (rf"\d{{{rest}}}" if rest else ""))
    alternatives.append(digits)
    return "(?:" + "|".join(dict.fromkeys(alternatives)) + ")"


# None, or a quarter, a third, a half, two thirds or three quarters of one device (see limits.SHARES).
SHARES = r"0(?:\.(?:0{1,3}|250?|333|50{0,2}|667|750?))?"


def decimal_pattern(field: serializers.DecimalField, *, shares: bool = True) -> str:
    """The one way to write a value of `field`: digits without leading zeros or sign, up to its
    decimal places, from its minimum (0 or its last decimal place) to its whole maximum. GPU counts (fields marked
    `gpu_shares`) are 0, a share of one device or whole devices (with `shares` false: any number in
    their range, which the field then refuses in the words of `gpu_shape_problem`)."""
    places = field.decimal_places or 0
    top = int(field.max_value) if field.max_value is not None else 10 ** (field.max_digits - places) - 1
    fraction = rf"(?:\.\d{{1,{places}}})?" if places else ""
    zeros = rf"(?:\.0{{1,{places}}})?" if places else ""
    if shares and getattr(field, "gpu_shares", False):
        whole = _up_to(top).replace("(?:0|", "(?:", 1)
        return rf"^(?:{SHARES}|{whole}{zeros})$"
    below = _up_to(top - 1)
    if field.min_value is not None and field.min_value > 0:
        assert places and field.min_value == Decimal(1).scaleb(-places), "only a minimum of 0 or the last place"
        below = _up_to(top - 1).replace("(?:0|", "(?:", 1) if top > 1 else "(?!)"
        # Below one and above zero: k zeros, a digit that is not, then what places are left.
        tiny = "|".join("0" * k + rf"[1-9]\d{{0,{places - 1 - k}}}" for k in range(places))
        return rf"^(?:0\.(?:{tiny})|{below}{fraction}|{top}{zeros})$"
    return rf"^(?:{below}{fraction}|{top}{zeros})$"


def _wanted(field: serializers.Field) -> tuple[tuple[type, ...], str] | None:
    """The JSON types `field` takes, and how to say so; None where any (or its own check) will do."""
    if isinstance(field, serializers.BooleanField):
        return (bool,), "true or false"
    if isinstance(field, serializers.IntegerField):
        return (int,), "a whole number"
    if isinstance(field, serializers.FloatField):
        return (int, float), "a number"
    if isinstance(field, serializers.DecimalField):
        return (str,), 'a decimal number written as a string, such as "0.5"'
    if (
        isinstance(field, serializers.ChoiceField)
        and field.choices
        and all(isinstance(key, int) and not isinstance(key, bool) for key in field.choices)
    ):
        return (int,), "a whole number"
    if isinstance(field, PrimaryKeyRelatedField):
        return (int,), "an id (a whole number)"
    if isinstance(field, (serializers.CharField, serializers.ChoiceField, RelatedField)):
        return (str,), "a string"
    if isinstance(field, (serializers.ListField, ManyRelatedField)):
        return (list,), "a list"
    if isinstance(field, (serializers.DictField, serializers.Serializer)):
        return (dict,), "an object"
    return None


def type_errors(field: serializers.Field, value: Any) -> list[str]:
    """Why `value` is not of the JSON type `field` takes (nothing if it is), items included."""
    if value is None:
        return []  # the field's allow_null decides
    wanted = _wanted(field)
    if wanted is None:
        return []
    types, words = wanted
    if isinstance(value, bool) and bool not in types or not isinstance(value, types):
        return [f"Expected {words}."]
    if isinstance(field, serializers.DecimalField) and not re.fullmatch(decimal_pattern(field), value):
        if getattr(field, "gpu_shares", False) and re.fullmatch(decimal_pattern(field, shares=False), value):
            return []  # a number, but not a share of one device: the field says so (GPUCountField)
        return [f"{value!r} is not a number this field takes ({_range(field)})."]
    child = getattr(field, "child", None) or getattr(field, "child_relation", None)
    if isinstance(value, list) and child is not None:
        for index, item in enumerate(value):
            errors = type_errors(child, item)
            if errors:
                return [f"Item {index}: {errors[0]}"]
    if isinstance(value, dict) and isinstance(field, serializers.DictField) and child is not None:
        for key, item in value.items():
            errors = type_errors(child, item)
            if errors:
                return [f"{key}: {errors[0]}"]
    return []


def _range(field: serializers.DecimalField) -> str:
    if getattr(field, "gpu_shares", False):
        return f"0, {SHARES_TEXT}, or a whole number of GPUs up to {field.max_value}"
    low = field.min_value if field.min_value is not None else 0
    return f'from {low} to {field.max_value}, at most {field.decimal_places} decimals, such as "1.5"'


class StrictTypes:
    """Refuse, before the fields read them, body values of another JSON type than each field takes.

    Only for a JSON body of an API request: the web pages feed the same serializers with form
    fields, which are all strings."""

    def _json_body(self) -> bool:
        request = getattr(self, "context", {}).get("request")
        return isinstance(request, Request) and (request.content_type or "").startswith("application/json")

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, Mapping) and self._json_body():
            writable = {f.field_name for f in self.fields.values() if not f.read_only}  # type: ignore[attr-defined]
            known = {f.field_name for f in self.fields.values()}  # type: ignore[attr-defined]
            unknown = sorted(str(key) for key in data if key not in known)
            if unknown:
                takes = ", ".join(sorted(writable)) or "nothing"
                raise serializers.ValidationError({key: [f"Unknown field. This takes: {takes}."] for key in unknown})
            errors = {}
            for name, field in self.fields.items():  # type: ignore[attr-defined]
                if field.read_only or field.field_name not in data:
                    continue
                problems = type_errors(field, data[field.field_name])
                if problems:
                    errors[name] = problems
            if errors:
                raise serializers.ValidationError(errors)
        return super().to_internal_value(data)  # type: ignore[misc]


class ThousandthsField(serializers.DecimalField):
    """GPUs in thousandths, answered with two decimal places unless a third is needed ("2.00",
    "0.25", "0.333"), as before thirds were accepted."""

    def to_representation(self, value: Any) -> str:
        text = str(super().to_representation(value))
        return text[:-1] if text.endswith("0") and "." in text else text


class GPUCountField(ThousandthsField):
    """GPUs per replica: 0, a share of one device (limits.SHARES) or whole devices, up to 1024."""

    gpu_shares = True

    def __init__(self, **kwargs: Any):
        kwargs.setdefault("max_digits", 7)
        kwargs.setdefault("decimal_places", 3)
        kwargs.setdefault("min_value", Decimal("0"))
        kwargs.setdefault("max_value", Decimal("1024"))
        super().__init__(**kwargs)

    def to_internal_value(self, data: Any) -> Decimal:
        """A number of GPUs the portal takes, refused in the same words whether it came from the
        API, a page's form or the CLI."""
        value: Decimal = super().to_internal_value(data)
        problem = gpu_shape_problem(value)
        if problem:
            raise serializers.ValidationError(problem)
        return value


class DecimalSchema(OpenApiSerializerFieldExtension):
    """The schema of a decimal says exactly what the server takes (`decimal_pattern`)."""

    target_class = "rest_framework.fields.DecimalField"
    match_subclasses = True

    def map_serializer_field(self, auto_schema: Any, direction: str) -> dict[str, Any]:
        return {"type": "string", "format": "decimal", "pattern": decimal_pattern(self.target)}


class StrictModelSerializer(StrictTypes, serializers.ModelSerializer):
    pass


class StrictSerializer(StrictTypes, serializers.Serializer):
    pass
