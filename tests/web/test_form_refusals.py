"""A form's refusal of a number of GPUs says what the API and the CLI say (docs/fractional-gpus.md
promises the same words), and the page puts the focus on the first field it refuses."""

from __future__ import annotations

import html
import re
from decimal import Decimal

import pytest

from apps.scheduling.types import gpu_shape_problem
from tests.personas import World
from tests.web.test_pages import SignedIn

FORM = {"name": "train", "command": "true", "gpu_type": "h100", "replicas": "1", "priority": "0",
        "cpu_cores": "1", "memory_gb": "4"}  # fmt: skip


def _field_errors(page: str, field: str) -> list[str]:
    block = re.search(rf'<div id="{field}-error">(.*?)</div>', page, re.S)
    assert block, page
    return [html.unescape(e) for e in re.findall(r'<p class="field-error">(.*?)</p>', block.group(1), re.S)]


@pytest.mark.parametrize("gpus", ["0.3", "1.5"])
def test_the_job_form_refuses_a_gpu_count_in_the_apis_words(world: World, signed_in: SignedIn, gpus: str) -> None:
    answer = signed_in(world.alice).post("/w/team-a/jobs/new/", {**FORM, "gpus_per_replica": gpus})
    api = world.client(world.alice).post(
        "/api/v1/jobs/", {"workspace": "team-a", "name": "train", "command": "true", "gpu_type": "h100",
                          "gpus_per_replica": gpus}, format="json",
    )  # fmt: skip

    assert answer.status_code == 400 and api.status_code == 400
    words = gpu_shape_problem(Decimal(gpus))
    assert words and "a share of one device is 0.25, 0.333, 0.5, 0.667 or 0.75" in words
    assert _field_errors(answer.content.decode(), "gpus_per_replica") == [words]
    assert "{#" not in answer.content.decode()  # no template comment shows as text
    assert api.json()["error"]["fields"] == {"gpus_per_replica": [words]}


def test_the_first_refused_field_has_the_focus(world: World, signed_in: SignedIn) -> None:
    page = signed_in(world.alice).post("/w/team-a/jobs/new/", {**FORM, "gpus_per_replica": "0.3"}).content.decode()

    focused = re.findall(r"<(?:input|select|textarea)\b[^>]*\bautofocus\b[^>]*>", page)
    assert focused and 'name="gpus_per_replica"' in focused[0], focused
    assert not any('name="name"' in tag for tag in focused)
    # Without an error, the form starts at its first field.
    fresh = signed_in(world.alice).get("/w/team-a/jobs/new/").content.decode()
    assert re.search(r'<input id="id_name" name="name"[^>]*\bautofocus\b', fresh)
