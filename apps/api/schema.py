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
                "field_codes": {
                    "type": "object",
                    "additionalProperties": {"type": "array", "items": {"type": "string"}},
                },
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
    _no_null_characters_in_query_strings(result)
    _lists_in_one_parameter(result)
    for name, component in result["components"]["schemas"].items():
        if name.endswith("Request") and component.get("type") == "object":
            component["additionalProperties"] = False  # the API refuses a field it does not know
            _no_null_characters(component)
    reference = {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
    for path in result.get("paths", {}).values():
        for method, operation in path.items():
            if not isinstance(operation, dict) or "responses" not in operation:
                continue
            statuses = {**ANY, **(WRITES if method in ("post", "put", "patch", "delete") else {})}
            for status, description in statuses.items():
                operation["responses"].setdefault(status, {"description": description, "content": reference})
    return result


def _no_null_characters_in_query_strings(result: dict[str, Any]) -> None:
    """A free-text query parameter takes any character but NUL (which the filters refuse)."""
    for path in result.get("paths", {}).values():
        for operation in path.values():
            for parameter in operation.get("parameters", []) if isinstance(operation, dict) else []:
                schema = parameter.get("schema", {})
                if (
                    parameter.get("in") == "query"
                    and schema.get("type") == "string"
                    and not ({"enum", "pattern", "format"} & set(schema))
                ):
                    schema["pattern"] = NO_NUL


NO_NUL = "^[^\\u0000]*$"


def _no_null_characters(node: Any) -> None:
    """Free text in a request body takes any character but NUL (which the API refuses)."""
    if isinstance(node, dict):
        if node.get("type") == "string" and not ({"enum", "pattern", "format"} & set(node)):
            node["pattern"] = NO_NUL
        for value in node.values():
            _no_null_characters(value)
    elif isinstance(node, list):
        for item in node:
            _no_null_characters(item)


def _lists_in_one_parameter(result: dict[str, Any]) -> None:
    """`state__in=A,B`: one parameter, comma-separated (not repeated), of the values `state` takes."""
    for path in result.get("paths", {}).values():
        for operation in path.values():
            parameters = operation.get("parameters", []) if isinstance(operation, dict) else []
            by_name = {p.get("name"): p for p in parameters}
            for parameter in parameters:
                name = parameter.get("name", "")
                if parameter.get("in") != "query" or not name.endswith("__in"):
                    continue
                parameter["style"], parameter["explode"] = "form", False
                single = by_name.get(name.removesuffix("__in"), {}).get("schema", {})
                items = parameter.setdefault("schema", {}).setdefault("items", {"type": "string"})
                if "enum" in single:
                    items["enum"] = single["enum"]
                else:
                    items.setdefault("pattern", "^[^,\\u0000]*$")


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
