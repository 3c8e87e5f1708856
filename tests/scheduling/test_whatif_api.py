"""`/api/v1/admin/whatif/` and the console's What-if page: admins start a replay and read its figures;
anyone else, a workspace owner included, is refused and learns nothing."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from apps.audit.models import AuditEvent
from apps.scheduling import whatif
from apps.scheduling.models import WhatIfReplay
from tests.personas import PASSWORD, World
from tests.scheduling.test_whatif import HOUR, T0, at, contended_day

URL = "/api/v1/admin/whatif/"
ROW = dict.fromkeys(whatif.FIGURES, 0)
FIGURES = {"baseline": {whatif.ALL: ROW, "team-b": ROW}, "whatif": {whatif.ALL: ROW, "team-b": ROW},
           "settings": {"baseline": {}, "whatif": {}}}  # fmt: skip
ASK = {"since": T0.isoformat(), "until": at(86400).isoformat(), "quotas": ["team-b=+4"], "cluster_gpus": "+0"}


@pytest.fixture
def inline(settings: Any) -> None:
    settings.PORTAL_WORKLOAD_TRIGGER = "inline"  # the replay's task runs in this process on commit


def test_an_admin_runs_a_replay_in_the_background_and_reads_it_side_by_side(
    world: World, inline: None, django_capture_on_commit_callbacks: Any, django_assert_max_num_queries: Any
) -> None:
    contended_day(world)
    admin = world.client(world.admin)
    with django_capture_on_commit_callbacks(execute=True):
        response = admin.post(URL, ASK, format="json")
    assert response.status_code == 201, response.json()
    run_id = response.json()["id"]
    assert response.json()["changes"] == {"quotas": {"team-b": "+4"}, "cluster_gpus": "+0"}
    started = AuditEvent.objects.get(action="whatif.start")
    assert (started.actor, started.target_id, started.via) == (world.admin, str(run_id), "api")
    assert started.data["changes"] == ["quota of team-b: +4 GPUs", "cluster: +0 GPUs"]
    shown = admin.get(f"{URL}{run_id}/").json()
    assert shown["state"] == "SUCCEEDED" and shown["progress"] == 1.0
    assert shown["changes_text"] == ["quota of team-b: +4 GPUs", "cluster: +0 GPUs"]
    figures = shown["result"]
    assert figures["baseline"]["team-b"]["mean_wait_s"] == pytest.approx(1.5 * HOUR, abs=10)
    assert figures["whatif"]["team-b"]["mean_wait_s"] < figures["baseline"]["team-b"]["mean_wait_s"]
    WhatIfReplay.objects.bulk_create([WhatIfReplay(since=T0, until=at(60)) for _ in range(3)])
    with django_assert_max_num_queries(6):  # the token, the user, one for the list: not one a replay
        listed = admin.get(URL).json()["results"]
    assert [item["id"] for item in listed][-1] == run_id and len(listed) == 4
    assert listed[-1]["result"] == figures and listed[0]["result"] is None
    csv = admin.get(f"{URL}{run_id}/csv/", HTTP_ACCEPT="text/csv")
    assert csv.status_code == 200 and csv["Content-Type"].startswith("text/csv")
    assert csv.content.decode().splitlines()[3].startswith("team-b,4,4,0,0,5400,")


def test_it_answers_400_naming_each_field_at_fault(world: World) -> None:
    admin = world.client(world.admin)
    bad = {
        "since": at(10).isoformat(),
        "until": at(0).isoformat(),
        "quotas": ["team-b=lots", "nobody=+1"],
        "cohorts": ["team-a=Not A Name"],
        "policy": "random",
        "min_runtime_s": -1,
        "cluster_gpus": "double",
    }
    response = admin.post(URL, bad, format="json")
    assert response.status_code == 400
    fields = response.json()["error"]["fields"]
    assert set(fields) == {"quotas.0", "cohorts.0", "policy", "min_runtime_s", "cluster_gpus"}
    assert "'team-b=lots': the quota must be +N, -N or N whole GPUs" in fields["quotas.0"][0]
    assert fields["cluster_gpus"] == ["Give +N, -N or N whole GPUs, such as +16 or 64."]
    # Well-formed, but not against today's settings.
    response = admin.post(URL, {**bad, "quotas": ["team-b=-5", "nobody=+1"], "cohorts": [], "policy": "fifo",
                                "min_runtime_s": 0, "cluster_gpus": "-8"}, format="json")  # fmt: skip
    assert response.status_code == 400
    assert response.json()["error"]["fields"] == {
        "until": ["The window must end after it begins."],
        "quotas": ["There is no workspace named nobody.", "team-b has 4 GPUs of quota: -5 leaves fewer than 0."],
        "cluster_gpus": ["The cluster has 8 GPUs: -8 makes 0; give 1 to 100,000."],
    }
    assert admin.post(URL, {}, format="json").json()["error"]["fields"] == {"since": ["This field is required."]}
    assert not WhatIfReplay.objects.exists()


@pytest.mark.parametrize("persona", ["alice", "charlie", "victor"])
def test_nobody_but_an_admin_starts_lists_or_reads_a_replay(world: World, persona: str) -> None:
    """A tenant, a workspace owner included, gets a 403 on every route and learns nothing of the
    admin's replays: neither their changes nor the other workspaces' figures."""
    run = WhatIfReplay.objects.create(
        created_by=world.admin, since=T0, until=at(60), changes={"quotas": {"team-b": "+16"}},
        state=WhatIfReplay.State.SUCCEEDED, result=FIGURES,
    )  # fmt: skip
    hostile = world.client(getattr(world, persona))
    answers = [
        hostile.get(URL),
        hostile.post(URL, ASK, format="json"),
        hostile.get(f"{URL}{run.pk}/"),
        hostile.get(f"{URL}{run.pk}/csv/"),
        hostile.get(f"{URL}987654/"),
    ]
    for response in answers:
        assert response.status_code == 403, response.content
        assert b"team-b" not in response.content and b"+16" not in response.content
    assert WhatIfReplay.objects.count() == 1
    assert world.client(world.admin).get(f"{URL}987654/").status_code == 404
    anonymous = Client().get(f"{URL}{run.pk}/")
    assert anonymous.status_code == 401


@pytest.mark.parametrize("persona", ["alice", "charlie"])
def test_the_console_page_is_for_admins_only(world: World, persona: str) -> None:
    run = WhatIfReplay.objects.create(
        created_by=world.admin, since=T0, until=at(60), state=WhatIfReplay.State.SUCCEEDED,
        result=FIGURES,
    )  # fmt: skip
    browser = Client()
    assert browser.login(username=persona, password=PASSWORD)
    for url in ("/console/whatif/", f"/console/whatif/{run.pk}/", f"/console/whatif/{run.pk}/csv/"):
        assert browser.get(url).status_code == 403, url
    assert browser.post("/console/whatif/", {"since": T0.isoformat()}).status_code == 403
    assert WhatIfReplay.objects.count() == 1


def test_an_admin_starts_one_from_the_console_and_reads_it_there(
    world: World, inline: None, django_capture_on_commit_callbacks: Any
) -> None:
    contended_day(world)
    browser = Client()
    assert browser.login(username="admin", password=PASSWORD)
    page = browser.get("/console/whatif/")
    assert page.status_code == 200 and b"team-b" in page.content
    form = {"since": "2026-11-02T09:00", "until": "2026-11-03T09:00", "quotas": "team-b=+4\n", "cohorts": "",
            "policy": "", "min_runtime_s": "", "starvation_s": "", "preemption": "", "cluster_gpus": ""}  # fmt: skip
    refused = browser.post("/console/whatif/", {**form, "quotas": "team-b=lots"})
    assert refused.status_code == 400 and b"must be +N, -N or N whole GPUs" in refused.content
    with django_capture_on_commit_callbacks(execute=True):
        started = browser.post("/console/whatif/", form)
    assert started.status_code == 302
    run = WhatIfReplay.objects.get()
    assert started["Location"] == f"/console/whatif/{run.pk}/"
    shown = browser.get(started["Location"])
    assert shown.status_code == 200
    text = shown.content.decode()
    assert "quota of team-b: +4 GPUs" in text and "1 h 30 min" in text  # team-b's mean wait today
    csv = browser.get(f"/console/whatif/{run.pk}/csv/")
    assert csv.status_code == 200 and csv.content.decode().startswith("workspace,jobs_baseline")


def test_a_running_replay_shows_its_progress_and_refreshes_itself(world: World) -> None:
    run = WhatIfReplay.objects.create(since=T0, until=at(60), state=WhatIfReplay.State.RUNNING, progress=0.4)
    browser = Client()
    assert browser.login(username="admin", password=PASSWORD)
    text = browser.get(f"/console/whatif/{run.pk}/").content.decode()
    assert '<progress max="100" value="40"' in text and '<meta http-equiv="refresh" content="2">' in text
    WhatIfReplay.objects.filter(pk=run.pk).update(state=WhatIfReplay.State.FAILED, message="The engine stalled.")
    text = browser.get(f"/console/whatif/{run.pk}/").content.decode()
    assert "The replay failed: The engine stalled." in text and "http-equiv" not in text
    assert browser.get(f"/console/whatif/{run.pk}/csv/").status_code == 404  # no figures to download
    assert world.client(world.admin).get(f"{URL}{run.pk}/csv/").json()["error"]["code"] == "conflict"
