"""Actions raise the errors of apps/errors.py, which know nothing of DRF; the API maps them."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from apps.api.errors import exception_handler
from apps.errors import ActionError, Conflict, LimitExceeded

ROOT = Path(__file__).resolve().parents[1]
DOMAIN = sorted(ROOT.glob("apps/*/actions.py")) + [ROOT / "apps/errors.py"]


def _imported(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


@pytest.mark.parametrize("path", DOMAIN, ids=lambda p: str(p.relative_to(ROOT)))
def test_it_keeps_drf_and_the_api_out_of_actions_and_their_errors(path: Path) -> None:
    banned = [name for name in _imported(path) if name.split(".")[0] == "rest_framework" or name.startswith("apps.api")]
    assert banned == []


@pytest.mark.parametrize(
    ("error", "status", "code"),
    [
        (ActionError("No."), 400, "invalid"),
        (LimitExceeded("Too many."), 409, "limit_exceeded"),
        (Conflict("Not now."), 409, "conflict"),
    ],
)
def test_it_answers_each_error_with_its_status_and_code(error: ActionError, status: int, code: str) -> None:
    response = exception_handler(error, {})
    assert response is not None and response.status_code == status
    assert response.data == {"error": {"status": status, "code": code, "message": error.message}}


def test_it_names_the_field_a_refusal_is_about_with_the_rule_code() -> None:
    response = exception_handler(ActionError("Pick a smaller one.", field="size"), {})
    assert response is not None
    assert response.data["error"]["fields"] == {"size": ["Pick a smaller one."]}
    assert response.data["error"]["field_codes"] == {"size": ["rule"]}
