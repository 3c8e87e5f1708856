"""Workspaces' provisioning policies through the API: members read their own workspace's (the
portal's defaults where it has none), only platform admins set them, other tenants' do not exist,
and what is set decides the next request."""

from __future__ import annotations

import pytest

from apps.provisioning import actions
from apps.provisioning.models import ProvisioningRequest
from tests.personas import World

pytestmark = pytest.mark.django_db


def test_members_read_the_defaults_admins_set_a_policy_and_it_decides_the_next_request(world: World) -> None:
    alice, admin = world.client(world.alice), world.client(world.admin)
    shown = alice.get("/api/v1/gpr-policies/team-a/").json()
    assert shown == {"workspace": "team-a", "auto_approve_max_s": 86400, "max_duration_s": 14 * 86400,
                     "max_gpus": None, "updated_at": None, "defaults": True}  # fmt: skip
    refused = alice.put("/api/v1/gpr-policies/team-a/", {"auto_approve_max_s": None}, format="json")
    assert refused.status_code == 403
    set_ = admin.patch("/api/v1/gpr-policies/team-a/", {"auto_approve_max_s": None, "max_gpus": 2}, format="json")
    assert set_.status_code == 200, set_.json()
    assert (set_.json()["auto_approve_max_s"], set_.json()["max_gpus"], set_.json()["defaults"]) == (None, 2, False)
    asked = actions.check_request(world.team_a, gpu_type="h100", gpus=1, duration_s=3600)
    gpr = actions.do_request(asked, priority=0, justification="x", acting_user=world.alice)
    assert gpr.state == ProvisioningRequest.State.REQUESTED  # an admin decides each, now


def test_bad_policies_are_400_and_another_tenants_is_not_found(world: World) -> None:
    admin = world.client(world.admin)
    bad = admin.patch("/api/v1/gpr-policies/team-a/", {"max_duration_s": 60}, format="json")
    assert bad.status_code == 400 and "max_duration_s" in bad.json()["error"]["fields"]
    longer = admin.patch("/api/v1/gpr-policies/team-a/", {"auto_approve_max_s": 30 * 86400}, format="json")
    assert longer.status_code == 400 and "auto_approve_max_s" in longer.json()["error"]["fields"]
    assert world.client(world.charlie).get("/api/v1/gpr-policies/team-a/").status_code == 404
