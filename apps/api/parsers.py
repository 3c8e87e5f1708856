from __future__ import annotations

import re
from typing import Any

from rest_framework.exceptions import ErrorDetail, ParseError, ValidationError
from rest_framework.parsers import JSONParser

from apps.errors import RULE

# Valid JSON but not text: PostgreSQL cannot store NUL, and a lone surrogate cannot be encoded.
BAD_TEXT_RE = re.compile("[\x00\ud800-\udfff]")


def _refuse_bad_text(data: Any) -> None:
    """Raise a ValidationError naming the first place ("env.KEY", "groups.0") holding a string with
    NUL or a lone surrogate, in a key or a value."""
    stack: list[tuple[str, Any]] = [("", data)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, dict):
            for key in value:
                if BAD_TEXT_RE.search(key):
                    _refuse(path, key)  # not in the path: the answer could not carry it
            stack.extend((f"{path}.{key}" if path else key, item) for key, item in value.items())
        elif isinstance(value, list):
            stack.extend((f"{path}.{i}" if path else str(i), item) for i, item in enumerate(value))
        elif isinstance(value, str) and BAD_TEXT_RE.search(value):
            _refuse(path, value)


def _refuse(path: str, text: str) -> None:
    """The schema says it (its strings and names match ``^[^\\u0000]*$``), as a rule."""
    what = "Null" if "\x00" in text else "Surrogate"
    raise ValidationError({path or "non_field_errors": [ErrorDetail(f"{what} characters are not allowed.", code=RULE)]})


class SafeJSONParser(JSONParser):
    """JSON that cannot crash a view: deep nesting and oversized bodies are a 400, not a 500,
    and so are strings the database cannot store."""

    max_bytes = 2 * 1024 * 1024

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        request = (parser_context or {}).get("request")
        length = int(request.META.get("CONTENT_LENGTH") or 0) if request is not None else 0
        if length > self.max_bytes:
            raise ParseError(f"The body is larger than {self.max_bytes // 1024} KiB.")
        try:
            data = super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise ParseError("JSON parse error - the body is nested too deeply.") from None
        _refuse_bad_text(data)
        return data
