"""The OpenAPI schema's error answers: every operation documents the API's one error shape for the
statuses it can give (apps/api/errors.py), so clients and schema checks know them."""

from __future__ import annotations

from typing import Any

ERROR_SCHEMA = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["status", "code", "message"],
            "properties": {
                "status": {"type": "integer"},
                "code": {"type": "string"},
                "message": {"type": "string"},
                "fields": {"type": "object", "additionalProperties": {"type": "array", "items": {"type": "string"}}},
            },
        }
    },
}

# What any operation may answer besides its own success: bad input, no or bad credentials, not
# allowed, not found (another tenant's object, a page past the end), a method it lacks, a body
# that is not JSON, too many requests. Writes may also conflict with the object's state or limits.
ANY = {
    "400": "Bad request: the fields at fault are named.",
    "401": "No valid credentials (`WWW-Authenticate: Token`).",
    "403": "Not allowed for this user.",
    "404": "Not found, or not yours.",
    "405": "Method not allowed.",
    "406": "Not acceptable.",
    "415": "Unsupported media type: send JSON.",
    "429": "Too many requests.",
}
WRITES = {"409": "Conflict with the object's state or a hard limit.", "413": "The body is too large."}


def add_error_responses(result: dict[str, Any], generator: Any, request: Any, public: bool) -> dict[str, Any]:
    """drf-spectacular postprocessing hook: the error shape as a component, and on every operation;
    no pattern that means one thing to the server and another to a client (below)."""
    result.setdefault("components", {}).setdefault("schemas", {})["Error"] = ERROR_SCHEMA
    _drop_unicode_word_patterns(result)
    reference = {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
    for path in result.get("paths", {}).values():
        for method, operation in path.items():
            if not isinstance(operation, dict) or "responses" not in operation:
                continue
            statuses = {**ANY, **(WRITES if method in ("post", "put", "patch", "delete") else {})}
            for status, description in statuses.items():
                operation["responses"].setdefault(status, {"description": description, "content": reference})
    return result


def _drop_unicode_word_patterns(node: Any) -> None:
    """Remove patterns with ``\\w``: Python's (the server's) matches any letter, an OpenAPI (ECMA-262)
    pattern's only ASCII ones, so a name such as "Équipe" would break its own schema. The server
    still validates; the field's description says what it takes."""
    if isinstance(node, dict):
        if isinstance(node.get("pattern"), str) and "\\w" in node["pattern"]:
            del node["pattern"]
        for value in node.values():
            _drop_unicode_word_patterns(value)
    elif isinstance(node, list):
        for item in node:
            _drop_unicode_word_patterns(item)
