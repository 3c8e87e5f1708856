"""Words the pages show the same way everywhere: GPUs as "1 × H100", and names as they were given."""

from __future__ import annotations

import re
from typing import Any

from django.core.management import call_command

from apps.catalog.models import ComputeProfile, NotebookProfile
from apps.compute.actions import check_launch_instance
from tests.personas import World
from tests.web.test_pages import SignedIn, wizard


def test_the_wizard_says_gpus_one_way_on_every_step(world: World, signed_in: SignedIn) -> None:
    alice = signed_in(world.alice)
    sizes = wizard(alice, 1, 2, name="box").content.decode()
    card = re.search(r'<label class="card" data-profile="gpu-1">.*?</label>', sizes, re.S)
    assert card and '<div class="gpu">1 × H100</div>' in card.group(0)
    launch = wizard(alice, 2, 3, name="box", profile="gpu-1").content.decode()
    assert "1 × H100, 8 CPU, 64 GB" in launch
    assert not re.search(r"\d x h100", launch, re.I)


def test_instance_and_notebook_pages_say_gpus_the_wizards_way(world: World, signed_in: SignedIn) -> None:
    check_launch_instance(world.team_a, name="box", profile=world.gpu_1, acting_user=world.alice)
    alice = signed_in(world.alice)
    for url in ("/w/team-a/instances/", "/w/team-a/notebooks/new/"):
        page = alice.get(url).content.decode()
        assert "1 × H100, 8 CPU, 64 GB" in page and not re.search(r"\d x h100", page, re.I), url


def test_the_demo_profiles_are_shown_by_the_names_they_were_given(db: Any) -> None:
    call_command("seed_demo", "--quiet-passwords")
    shown = dict(ComputeProfile.objects.values_list("name", "display_name"))
    assert shown["cpu-small"] == "CPU small" and shown["gpu-1"] == "1 H100"
    assert dict(NotebookProfile.objects.values_list("name", "display_name"))["tensorflow"] == "TensorFlow"
