"""Admins curate compute profiles: a published one is visible at once, to the groups it names."""

from __future__ import annotations

from decimal import Decimal

from django.contrib.auth.models import AnonymousUser, Group

from apps.catalog.actions import do_delete_profile, do_save_profile
from apps.catalog.models import ComputeProfile
from apps.compute.actions import check_launch_instance
from apps.compute.models import Instance
from apps.errors import ActionError, Conflict
from tests.actions.refusals import refused
from tests.personas import World


def visible(user: object) -> set[str]:
    return set(ComputeProfile.objects.visible_to(user).values_list("name", flat=True))


def draft(world: World, name: str = "gpu-half") -> ComputeProfile:
    return do_save_profile(
        ComputeProfile(),
        acting_user=world.admin,
        name=name,
        gpu_type="h100",
        gpu_count=Decimal("0.5"),
        cpu_cores=4,
        memory_gb=32,
    )


def test_it_keeps_a_draft_profile_from_users(world: World) -> None:
    draft(world)

    assert "gpu-half" not in visible(world.alice)
    assert "gpu-half" in visible(world.admin)


def test_it_shows_a_published_profile_to_users_at_once(world: World) -> None:
    profile = draft(world)

    do_save_profile(profile, acting_user=world.admin, published=True)

    assert "gpu-half" in visible(world.alice)
    assert "gpu-half" in visible(world.charlie)
    instance = check_launch_instance(world.team_a, name="box", profile=profile, acting_user=world.alice)
    assert instance.state == Instance.State.QUEUED


def test_it_shows_a_profile_only_to_the_groups_it_names(world: World) -> None:
    profile = draft(world)
    team_a = Group.objects.get(name="team-a")

    do_save_profile(profile, acting_user=world.admin, published=True, visible_to=[team_a])

    assert "gpu-half" in visible(world.alice)
    assert "gpu-half" in visible(world.bob)
    assert "gpu-half" not in visible(world.charlie)
    assert "gpu-half" not in visible(world.victor)
    with refused(ActionError, "Profile gpu-half is not available to you.", field="profile"):
        check_launch_instance(world.team_b, name="box", profile=profile, acting_user=world.charlie)


def test_it_opens_a_profile_to_everyone_again(world: World) -> None:
    profile = draft(world)
    do_save_profile(profile, acting_user=world.admin, published=True, visible_to=[Group.objects.get(name="team-b")])

    do_save_profile(profile, acting_user=world.admin, visible_to=[])

    assert "gpu-half" in visible(world.alice)


def test_it_hides_an_unpublished_profile_again(world: World) -> None:
    do_save_profile(world.gpu_1, acting_user=world.admin, published=False)

    assert "gpu-1" not in visible(world.alice)


def test_it_shows_no_profile_to_anonymous_users(world: World) -> None:
    assert visible(AnonymousUser()) == set()


def test_it_logs_publishing_as_its_own_action(world: World) -> None:
    profile = draft(world)
    do_save_profile(profile, acting_user=world.admin, published=True)

    actions = list(world.admin.auditevent_set.order_by("id").values_list("action", flat=True))
    assert actions[-2:] == ["computeprofile.create", "computeprofile.publish"]


def test_it_refuses_a_duplicate_profile_name(world: World) -> None:
    with refused(ActionError, "A profile named gpu-1 already exists.", field="name"):
        do_save_profile(ComputeProfile(), acting_user=world.admin, name="gpu-1")


def test_it_refuses_to_delete_a_profile_that_was_used(world: World) -> None:
    check_launch_instance(world.team_a, name="box", profile=world.gpu_1, acting_user=world.alice)
    with refused(Conflict, "Profile gpu-1 has been used by instances, notebooks or endpoints; unpublish it instead."):
        do_delete_profile(world.gpu_1, acting_user=world.admin)
