"""The launch wizard shows, at step 2, sizes the workspace could never hold as disabled with the
reason (the launch's own size rule), and refuses one posted anyway at that step, not the last."""

from __future__ import annotations

import re
from decimal import Decimal

from apps.catalog.models import ComputeProfile
from apps.compute.models import Instance
from tests.personas import World
from tests.web.test_pages import SignedIn, wizard


def test_a_profile_larger_than_the_quota_is_shown_disabled_with_the_reason(world: World, signed_in: SignedIn) -> None:
    ComputeProfile.objects.create(name="gpu-8", gpu_type="h100", gpu_count=Decimal(8), cpu_cores=8, memory_gb=64,
                                  published=True)  # fmt: skip
    page = wizard(signed_in(world.alice), 1, 2, name="box").content.decode()
    card = re.search(r'<label class="card card-disabled" data-profile="gpu-8">.*?</label>', page, re.S)
    assert card, page
    assert re.search(r'<input type="radio" name="profile" value="gpu-8"\s+disabled', card.group(0))
    reason = "This asks for 8 h100 GPUs; workspace team-a can never hold more than 4"  # the launch's own words
    assert f"Not available here.</strong> {reason}" in card.group(0)
    fits = re.search(r'<label class="card" data-profile="gpu-1">.*?</label>', page, re.S)
    assert fits and "disabled" not in fits.group(0)


def test_a_forged_choice_of_a_disabled_size_is_refused_at_step_2(world: World, signed_in: SignedIn) -> None:
    ComputeProfile.objects.create(name="gpu-8", gpu_type="h100", gpu_count=Decimal(8), cpu_cores=8, memory_gb=64,
                                  published=True)  # fmt: skip
    alice = signed_in(world.alice)
    forged = wizard(alice, 2, 3, name="box", profile="gpu-8")
    assert forged.status_code == 400
    page = forged.content.decode()
    assert 'aria-current="step">Size' in page and 'id="profile-error"' in page
    assert "can never hold more than 4" in page
    assert wizard(alice, 3, 4, name="box", profile="gpu-8").status_code == 400  # the last step refuses too
    assert not Instance.objects.exists()
