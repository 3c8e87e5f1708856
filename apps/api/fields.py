"""Serializer fields shared across the API."""

from __future__ import annotations

import re
from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from apps.errors import RULE
from apps.names import DNS_LABEL_MESSAGE, DNS_LABEL_RE

ENV_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")


class NameField(serializers.RegexField):
    """A DNS-1123 label."""

    def __init__(self, **kwargs: Any):
        kwargs.setdefault("max_length", 63)
        # RegexField builds its validator from this message while it initialises.
        kwargs["error_messages"] = {"invalid": DNS_LABEL_MESSAGE, **kwargs.get("error_messages", {})}
        super().__init__(DNS_LABEL_RE, **kwargs)


@extend_schema_field(
    {
        "type": "object",
        "maxProperties": 100,
        "patternProperties": {ENV_KEY_RE.pattern: {"type": "string", "maxLength": 32768}},
        "additionalProperties": False,
    }
)
class EnvField(serializers.DictField):
    """Environment variables: at most 100, names like shell variables, values up to 32 KiB."""

    def __init__(self, **kwargs: Any):
        super().__init__(child=serializers.CharField(allow_blank=True, max_length=32768), **kwargs)

    def to_internal_value(self, data: Any) -> dict[str, str]:
        value = super().to_internal_value(data)
        if len(value) > 100:
            raise serializers.ValidationError("At most 100 environment variables.")
        bad = [key for key in value if not ENV_KEY_RE.match(key)]
        if bad:
            raise serializers.ValidationError(
                f"{bad[0]!r} is not a variable name: use letters, digits and '_', not starting with a digit."
            )
        return value


@extend_schema_field({"type": "array", "maxItems": 50, "items": {"type": "string", "minLength": 1, "maxLength": 500}})
class RelativePathListField(serializers.ListField):
    """Paths inside a job's working directory: relative, no '..'."""

    def __init__(self, **kwargs: Any):
        # Paths are taken as written (no trimming): what the schema says is what is stored.
        child = serializers.CharField(max_length=500, trim_whitespace=False)
        super().__init__(child=child, max_length=50, **kwargs)

    def to_internal_value(self, data: Any) -> list[str]:
        paths = super().to_internal_value(data)
        for path in paths:
            if path.startswith("/") or ".." in path.split("/"):
                message = f"{path!r}: use a path relative to the job's directory."
                raise serializers.ValidationError(message, code=RULE)
        return paths


class WorkspaceField(serializers.SlugRelatedField):
    """A workspace by name, among those the requesting user can see: others do not exist."""

    def __init__(self, **kwargs: Any):
        super().__init__(slug_field="name", **kwargs)

    def get_queryset(self) -> Any:
        from apps.workspaces.access import restrict
        from apps.workspaces.models import Workspace

        request = self.context.get("request")
        return restrict(Workspace.objects.all(), getattr(request, "user", None))


_SCALAR: list[dict[str, Any]] = [
    {"type": "string", "pattern": "^[^\\u0000]*$"},
    {"type": "number"},
    {"type": "boolean"},
]


@extend_schema_field(
    {
        "type": "object",
        "propertyNames": {"pattern": "^[^\\u0000]*$"},
        "additionalProperties": {
            "anyOf": [
                *_SCALAR,
                {
                    "type": "object",
                    "propertyNames": {"pattern": "^[^\\u0000]*$"},
                    "additionalProperties": {"anyOf": _SCALAR},
                },
            ]
        },
    }
)
class SettingsField(serializers.DictField):
    """Settings of a backend: names to strings, numbers, true/false, or one level of such names
    (e.g. `gpu_type_resources`)."""

    def to_internal_value(self, data: Any) -> dict[str, Any]:
        value = super().to_internal_value(data)
        for key, item in value.items():
            inner = item.values() if isinstance(item, dict) else [item]
            if any(not isinstance(v, (str, int, float, bool)) for v in inner):
                raise serializers.ValidationError(f"{key}: a setting is a string, a number, true or false, "
                                                  "or an object of such (one level).")  # fmt: skip
        return value
