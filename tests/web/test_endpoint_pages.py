"""The inference endpoint pages: the new-endpoint form (the API's serializer and action, refusals
beside their fields), the list and an endpoint's page (URL and how to call it, replicas, scaling
decisions, failure with the server's words, figures), a token shown once, scale, update and delete,
who may do what (another tenant: 404 everywhere; a viewer: no buttons, 403 on every change), the
Deploy button of a finished job, endpoint tokens on the tokens page, and the console's inference
profiles. No server runs: replicas stay queued (the workload trigger is off in tests)."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from apps.accounts.models import ApiToken
from apps.catalog.models import InferenceProfile
from apps.inference.models import Endpoint, Replica, Sample, ScaleEvent
from apps.jobs.models import Artifact, Job
from tests.inference.endpoints import cpu_profile, endpoint, model_in
from tests.personas import World
from tests.web.conftest import queries

SignedIn = Callable[[Any], Client]
LIST = "/w/team-a/endpoints/"
NEW = "/w/team-a/endpoints/new/"


@pytest.fixture(autouse=True)
def work(settings: Any, tmp_path: Path) -> Path:
    settings.PORTAL_WORK_DIR = tmp_path / "work"
    return Path(settings.PORTAL_WORK_DIR)


@pytest.fixture
def profile(world: World) -> InferenceProfile:
    return cpu_profile()


def form(**fields: str) -> dict[str, str]:
    return {
        "workspace": "team-a", "name": "chat", "profile": "llama-cpu", "source": "path", "path": "models/tiny.gguf",
        "min_replicas": "1", "max_replicas": "2", "scale_to_zero_s": "", **fields,
    }  # fmt: skip


def error_of(page: str, field: str) -> str:
    """The error shown beside a field ('' for none)."""
    found = page.split(f'id="{field}-error">', 1)
    return found[1].split("</div>", 1)[0] if len(found) == 2 else ""


def finished_job(world: World, work: Path, name: str = "train", workspace: Any = None) -> Job:
    """A job that succeeded and left a model under model/ (as the host records its artifacts)."""
    workspace = workspace or world.team_a
    job = Job.objects.create(workspace=workspace, name=name, state="SUCCEEDED", command="true")
    model_in(workspace, f"job-{job.pk}/model/tiny.gguf")
    Job.objects.filter(pk=job.pk).update(
        backend_state={"job_dir": str(work / workspace.name / f"job-{job.pk}")}, finished_at=timezone.now()
    )
    Artifact.objects.create(job=job, path="model/tiny.gguf", size_bytes=1)
    Artifact.objects.create(job=job, path="metrics.json", size_bytes=1)
    job.refresh_from_db()
    return job


def actions_of(page: str) -> str:
    """The buttons in the page's head."""
    return page.split('id="endpoint-actions"', 1)[1].split("</div>", 1)[0]


def page_of(made: Endpoint) -> str:
    return f"/w/{made.workspace.name}/endpoints/{made.pk}/"


# -- the form --------------------------------------------------------------------------------------


def test_an_endpoint_is_deployed_from_the_form_through_the_api_serializer_and_action(
    world: World, signed_in: SignedIn, profile: InferenceProfile
) -> None:
    model_in(world.team_a)
    cpu_profile("draft", published=False)  # not offered
    alice = signed_in(world.alice)
    page = alice.get(NEW).content.decode()
    assert '<option value="llama-cpu" selected>' in page or '<option value="llama-cpu" >' in page
    assert 'value="draft"' not in page
    assert '<option value="team-a" selected>' in page and 'name="min_replicas" type="number" value="1"' in page
    response = alice.post(NEW, form(scale_to_zero_s="300", description="A chat model"))
    made = Endpoint.objects.get(name="chat")
    assert response.status_code == 302 and response["Location"] == page_of(made)
    assert (made.workspace, made.profile, made.model_path, made.source) == (world.team_a, profile, "models/tiny.gguf",
                                                                            "path")  # fmt: skip
    assert (made.min_replicas, made.max_replicas, made.scale_to_zero_s) == (1, 2, 300)
    assert made.created_by == world.alice and made.description == "A chat model"
    assert [r.state for r in made.replicas.all()] == ["QUEUED"]


@pytest.mark.parametrize(
    ("fields", "field", "words"),
    [
        ({"name": "Not A Name"}, "name", "lowercase letters, digits or '-'"),
        ({"path": "models/none.gguf"}, "path", "does not exist"),
        ({"path": "../team-b/models/tiny.gguf"}, "path", "'..'"),
        ({"min_replicas": "3", "max_replicas": "2"}, "min_replicas", "between 0 and the maximum"),
        ({"min_replicas": "0"}, "min_replicas", "scale-to-zero delay"),
        ({"min_replicas": "0", "scale_to_zero_s": "5"}, "scale_to_zero_s", "60 to"),
        ({"max_replicas": "65"}, "max_replicas", "less than or equal to 64"),
        ({"profile": "nope"}, "profile", "No profile named nope"),
        ({"profile": "huge"}, "profile", "may use at most"),  # a replica's size: the profile's
        ({"source": "job", "source_job": "", "artifact": ""}, "source_job", "Name the model"),
        ({"workspace": "team-b"}, "workspace", "team-b"),  # another tenant's: unknown to alice
    ],
)
def test_form_errors_show_next_to_their_fields_and_nothing_is_made(
    world: World, signed_in: SignedIn, profile: InferenceProfile, fields: dict[str, str], field: str, words: str
) -> None:
    cpu_profile("huge", cpu_cores=1000)
    model_in(world.team_a)
    model_in(world.team_b)
    response = signed_in(world.alice).post(NEW, form(**fields))
    page = response.content.decode().replace("&#x27;", "'")
    assert response.status_code == 400, page[:300]
    assert words in error_of(page, field), (field, page[page.find("error") - 200 : page.find("error") + 400])
    assert not Endpoint.objects.exists() and not Replica.objects.exists()


def test_a_job_artifact_is_deployed_and_another_workspaces_job_is_refused(
    world: World, signed_in: SignedIn, profile: InferenceProfile, work: Path
) -> None:
    job = finished_job(world, work)
    theirs = finished_job(world, work, workspace=world.team_b)
    alice = signed_in(world.alice)
    page = alice.get(f"{NEW}?source=job&source_job={job.pk}&artifact=model/").content.decode()
    assert f'<option value="{job.pk}" selected>' in page and f'value="{theirs.pk}"' not in page
    assert 'id="id_source_job" name="source" value="job" checked' in page and 'value="model/"' in page
    refused = alice.post(NEW, form(source="job", source_job=str(theirs.pk), artifact="model/"))
    assert refused.status_code == 400 and "No job" in error_of(refused.content.decode(), "source_job")
    missing = alice.post(NEW, form(source="job", source_job=str(job.pk), artifact="weights/"))
    assert "no artifact weights" in error_of(missing.content.decode(), "artifact")
    assert not Endpoint.objects.exists()
    alice.post(NEW, form(source="job", source_job=str(job.pk), artifact="model/"))
    made = Endpoint.objects.get()
    assert (made.source, made.source_job_id, made.source_artifact) == ("artifact", job.pk, "model")


def test_a_finished_jobs_page_offers_to_deploy_its_artifact(world: World, signed_in: SignedIn, work: Path) -> None:
    job = finished_job(world, work)
    bare = Job.objects.create(workspace=world.team_a, name="no-files", state="SUCCEEDED", command="true")
    running = Job.objects.create(workspace=world.team_a, name="busy", state="RUNNING", command="true")
    Artifact.objects.create(job=running, path="model/tiny.gguf", size_bytes=1)
    alice = signed_in(world.alice)
    link = f'href="/w/team-a/endpoints/new/?source=job&amp;source_job={job.pk}&amp;artifact=model%2F"'
    assert link in alice.get(f"/w/team-a/jobs/{job.pk}/").content.decode()
    for other in (bare, running):
        assert "/endpoints/new/" not in alice.get(f"/w/team-a/jobs/{other.pk}/").content.decode()
    assert "/endpoints/new/" not in signed_in(world.victor).get(f"/w/team-a/jobs/{job.pk}/").content.decode()


# -- the list and the page -------------------------------------------------------------------------


def test_the_list_shows_each_endpoint_where_it_stands(
    world: World, signed_in: SignedIn, profile: InferenceProfile, work: Path
) -> None:
    chat = endpoint(world.team_a, world.alice, profile, min_replicas=1, max_replicas=3)
    Replica.objects.filter(endpoint=chat).update(state="READY")
    Endpoint.objects.filter(pk=chat.pk).update(state="READY")
    job = finished_job(world, work)
    endpoint(world.team_a, world.bob, profile, name="tuned", job=job, artifact="model/", path="")
    failed = endpoint(world.team_a, world.alice, profile, name="broke")
    Endpoint.objects.filter(pk=failed.pk).update(state="FAILED", failure_reason="replica broke-1 did not start: boom")
    endpoint(world.team_b, world.charlie, profile, name="theirs")
    alice = signed_in(world.alice)
    live = alice.get(LIST).content.decode()
    assert 'aria-current="page">Endpoints</a>' in live  # the workspace's navigation
    assert 'data-endpoint="chat"' in live and 'data-endpoint="tuned"' in live
    assert 'data-endpoint="broke"' not in live and 'data-endpoint="theirs"' not in live
    row = live.split('data-endpoint="chat"')[1].split("</tr>")[0]
    assert "1 serving / 1 wanted" in row and "between 1 and 3" in row and chat.url in row
    assert "llama-cpu" in row and "models/tiny.gguf" in row and 'data-state="READY">Ready' in row
    tuned = live.split('data-endpoint="tuned"')[1].split("</tr>")[0]
    assert f"job #{job.pk}" in tuned and "<code>model</code>" in tuned and 'data-state="DEPLOYING"' in tuned
    ended = alice.get(f"{LIST}?tab=ended").content.decode()
    assert 'data-endpoint="broke"' in ended and "did not start: boom" in ended
    fragment = alice.get(f"{LIST}?part=table&tab=live", headers={"HX-Request": "true"}).content.decode()
    assert fragment.lstrip().startswith("<table") and 'data-endpoint="chat"' in fragment


def test_the_list_costs_the_same_queries_for_many_endpoints(
    world: World, signed_in: SignedIn, profile: InferenceProfile
) -> None:
    alice = signed_in(world.alice)
    endpoint(world.team_a, world.alice, profile, name="ep-0")
    few = queries(alice, LIST)
    for i in range(1, 8):
        endpoint(world.team_a, world.bob if i % 2 else world.alice, profile, name=f"ep-{i}", max_replicas=2)
    assert queries(alice, LIST) == few


def test_an_endpoints_page_has_its_url_examples_replicas_decisions_and_figures(
    world: World, signed_in: SignedIn, profile: InferenceProfile
) -> None:
    made = endpoint(world.team_a, world.alice, profile, min_replicas=1, max_replicas=3)
    first = made.replicas.get()
    Replica.objects.filter(pk=first.pk).update(state="READY", started_at=timezone.now())
    extra = Replica.objects.create(workspace=world.team_a, name="chat-2", endpoint=made, version=1, baseline=False,
                                   wait_reason="waiting for quota: 4 of 4 cpu in use")  # fmt: skip
    ScaleEvent.objects.create(endpoint=made, from_replicas=1, to_replicas=2, reason="5 requests waiting for 3 s")
    alice = signed_in(world.alice)
    page = alice.get(page_of(made)).content.decode()
    assert made.url in page and 'data-copy="endpoint-url-text"' in page
    assert f'base_url="{made.url}"' in page and 'api_key=os.environ["ENDPOINT_TOKEN"]' in page
    assert f"curl {made.url}/chat/completions" in page and '"model": "chat"' in page.replace("&quot;", '"')
    table = page.split('id="endpoint-replicas-table"')[1].split("</table>")[0]
    assert f'data-replica-id="{first.pk}"' in table and 'data-state="READY">Serving' in table
    row = table.split(f'data-replica-id="{extra.pk}"')[1].split("</tr>")[0]
    assert "extra" in row and "waiting for quota: 4 of 4 cpu in use" in row and 'data-state="QUEUED"' in row
    decisions = page.split('id="endpoint-scale-events"')[1].split("</ol>")[0]
    assert "1 → 2" in decisions and "5 requests waiting for 3 s" in decisions and "deployed with 1 replica" in decisions
    assert f'data-endpoint-charts="/w/team-a/endpoints/{made.pk}/metrics.json"' in page
    assert "vendor/chartjs/chart.umd.min.js" in page and "web/endpoints.js" in page
    assert f'data-endpoint-log="/api/v1/endpoints/{made.pk}/logs/"' in page
    assert 'hx-trigger="live-endpoint-' + str(made.pk) in page
    for button in ("Make a token", "Scale…", "Update model…", "Delete…"):
        assert button in actions_of(page), button
    live = alice.get(f"{page_of(made)}?part=status", headers={"HX-Request": "true"}).content.decode()
    assert 'id="endpoint-replicas-table"' in live and 'id="endpoint-actions"' in live and "<html" not in live


def test_a_failed_endpoint_says_why_with_the_servers_last_lines(
    world: World, signed_in: SignedIn, profile: InferenceProfile
) -> None:
    made = endpoint(world.team_a, world.alice, profile)
    why = "replica chat-1 did not start: the server exited with 1; its last lines:\ngguf_init: <bad magic>"
    Endpoint.objects.filter(pk=made.pk).update(state="FAILED", failure_reason=why)
    Replica.objects.filter(endpoint=made).update(state="FAILED", reason="the server exited with 1")
    page = signed_in(world.alice).get(page_of(made)).content.decode()
    failure = page.split('id="endpoint-failure">')[1].split("</dd>")[0]
    assert "gguf_init: &lt;bad magic&gt;" in failure and "<pre" in failure  # escaped, its lines kept
    for button in ("Make a token", "Scale…", "Update model…", "Delete…"):
        assert button not in actions_of(page), button
    assert 'id="endpoint-call"' not in page  # nothing to call


def test_the_figures_come_as_buckets_of_the_window(
    world: World, signed_in: SignedIn, profile: InferenceProfile
) -> None:
    made = endpoint(world.team_a, world.alice, profile, min_replicas=1, max_replicas=4)
    Sample.objects.filter(endpoint=made).delete()  # the autoscaler's first, at its creation
    now = timezone.now()
    for i, (rate, p95, tokens) in enumerate([(2.0, 0.5, None), (4.0, 1.5, None), (6.0, 0.25, 30.0)]):
        Sample.objects.create(endpoint=made, at=now - timedelta(minutes=30 - 10 * i), replicas=1 + i, serving=1,
                              waiting=0, requests_per_s=rate, errors_per_s=0.0, p50_s=0.1, p95_s=p95,
                              tokens_per_s=tokens)  # fmt: skip
    Sample.objects.create(endpoint=made, at=now - timedelta(hours=3), replicas=9, serving=9, waiting=0,
                          requests_per_s=99.0, errors_per_s=0.0)  # fmt: skip
    alice = signed_in(world.alice)
    data = alice.get(f"{page_of(made)}metrics.json").json()
    assert data["samples"] == 3 and data["window"] == "1h" and (data["min_replicas"], data["max_replicas"]) == (1, 4)
    known = {name: [v for v in values if v is not None] for name, values in data["series"].items()}
    assert known["replicas"] == [1, 2, 3] and known["requests_per_s"] == [2.0, 4.0, 6.0]
    assert known["p95_s"] == [500.0, 1500.0, 250.0] and known["tokens_per_s"] == [30.0] and data["has_tokens"]
    assert len(data["labels"]) == len(data["series"]["replicas"]) <= 180
    assert alice.get(f"{page_of(made)}metrics.json?window=6h").json()["samples"] == 4
    assert signed_in(world.charlie).get(f"{page_of(made)}metrics.json").status_code == 404


# -- who may do what -------------------------------------------------------------------------------


def urls_of(made: Endpoint) -> list[str]:
    base = page_of(made)
    return [base, f"{base}metrics.json", f"{base}gpu.json", f"{base}scale/", f"{base}update/", f"{base}delete/"]


def test_another_tenant_gets_a_404_on_every_page_and_change(
    world: World, signed_in: SignedIn, profile: InferenceProfile
) -> None:
    made = endpoint(world.team_a, world.alice, profile)
    charlie = signed_in(world.charlie)
    for url in urls_of(made):
        assert charlie.get(url).status_code == 404, url
    for url in (f"{page_of(made)}token/", f"{page_of(made)}scale/", f"{page_of(made)}delete/"):
        assert charlie.post(url, {"max_replicas": "3"}).status_code == 404, url
    # Nor through charlie's own workspace's address.
    assert charlie.get(f"/w/team-b/endpoints/{made.pk}/").status_code == 404
    assert 'data-endpoint="chat"' not in charlie.get("/w/team-b/endpoints/").content.decode()
    made.refresh_from_db()
    assert made.state == "DEPLOYING" and made.max_replicas == 1
    assert not ApiToken.objects.filter(endpoint=made).exists()


def test_a_viewer_sees_no_buttons_and_is_refused_every_change(
    world: World, signed_in: SignedIn, profile: InferenceProfile
) -> None:
    made = endpoint(world.team_a, world.alice, profile)
    victor = signed_in(world.victor)
    page = victor.get(page_of(made)).content.decode()
    assert made.url in page
    for button in ("Make a token", "Scale…", "Update model…", "Delete…"):
        assert button not in actions_of(page), button
    assert 'href="/w/team-a/endpoints/new/"' not in victor.get(LIST).content.decode()
    assert victor.get(NEW).status_code == 403 and victor.post(NEW, form()).status_code == 403
    for url, body in ((f"{page_of(made)}token/", {}), (f"{page_of(made)}scale/", {"max_replicas": "3"}),
                      (f"{page_of(made)}update/", {"source": "path", "path": "x.gguf"}),
                      (f"{page_of(made)}delete/", {})):  # fmt: skip
        assert victor.get(url).status_code == 403, url
        assert victor.post(url, body).status_code == 403, url
    made.refresh_from_db()
    assert (made.state, made.max_replicas, made.version) == ("DEPLOYING", 1, 1)
    assert not ApiToken.objects.filter(endpoint=made).exists() and Endpoint.objects.count() == 1


# -- tokens, scale, update, delete -----------------------------------------------------------------


def test_a_token_for_the_endpoint_is_shown_once_and_listed_on_the_tokens_page(
    world: World, signed_in: SignedIn, profile: InferenceProfile
) -> None:
    made = endpoint(world.team_a, world.alice, profile)
    alice = signed_in(world.alice)
    response = alice.post(f"{page_of(made)}token/")
    assert response.status_code == 302 and response["Location"] == page_of(made)
    token = ApiToken.objects.get(endpoint=made)
    assert (token.user, token.workspace, token.scope, token.name) == (world.alice, world.team_a, "read",
                                                                      "calls endpoint chat")  # fmt: skip
    first = alice.get(page_of(made))
    assert "no-store" in first["Cache-Control"]
    text = re.search(r'<code id="new-token">([^<]+)</code>', first.content.decode())
    assert (
        text and text.group(1).startswith("gpp_") and f"export ENDPOINT_TOKEN={text.group(1)}" in first.content.decode()
    )
    assert 'id="new-token"' not in alice.get(page_of(made)).content.decode()  # once
    tokens = alice.get("/tokens/").content.decode()
    row = tokens.split(f'data-token="{token.key_id}"')[1].split("</tr>")[0]
    assert f'href="{page_of(made)}"' in row and "chat" in row


def test_scale_and_update_change_the_endpoint_through_its_action(
    world: World, signed_in: SignedIn, profile: InferenceProfile
) -> None:
    made = endpoint(world.team_a, world.alice, profile)
    model_in(world.team_a, "models/v2.gguf")
    alice = signed_in(world.alice)
    scale = alice.get(f"{page_of(made)}scale/").content.decode()
    assert 'name="max_replicas" type="number" value="1"' in scale
    refused = alice.post(f"{page_of(made)}scale/", {"min_replicas": "3", "max_replicas": "2", "scale_to_zero_s": ""})
    assert refused.status_code == 400 and "between 0 and the maximum" in error_of(
        refused.content.decode(), "min_replicas"
    )
    done = alice.post(f"{page_of(made)}scale/", {"min_replicas": "0", "max_replicas": "3", "scale_to_zero_s": "120"})
    assert done.status_code == 302
    made.refresh_from_db()
    assert (made.min_replicas, made.max_replicas, made.scale_to_zero_s) == (0, 3, 120)

    missing = alice.post(f"{page_of(made)}update/", {"source": "path", "path": "models/none.gguf"})
    assert missing.status_code == 400 and "does not exist" in error_of(missing.content.decode(), "path")
    assert alice.post(f"{page_of(made)}update/", {"source": "path", "path": "models/v2.gguf"}).status_code == 302
    made.refresh_from_db()
    assert (made.version, made.model_path) == (2, "models/v2.gguf")


def test_delete_asks_first_then_stops_the_endpoint(
    world: World, signed_in: SignedIn, profile: InferenceProfile
) -> None:
    made = endpoint(world.team_a, world.alice, profile)
    alice = signed_in(world.alice)
    ask = alice.get(f"{page_of(made)}delete/").content.decode()
    assert "Delete endpoint chat?" in ask and "Delete the endpoint" in ask
    assert Endpoint.objects.get(pk=made.pk).state == "DEPLOYING"  # asking changes nothing
    assert alice.post(f"{page_of(made)}delete/").status_code == 302
    assert Endpoint.objects.get(pk=made.pk).state in ("DELETING", "DELETED")
    assert "Delete…" not in actions_of(alice.get(page_of(made)).content.decode())


def test_a_replica_links_to_its_endpoint(world: World, signed_in: SignedIn, profile: InferenceProfile) -> None:
    made = endpoint(world.team_a, world.alice, profile)
    replica = made.replicas.get()
    response = signed_in(world.alice).get(f"/w/team-a/replicas/{replica.pk}/")
    assert response.status_code == 302 and response["Location"] == page_of(made)
    assert signed_in(world.charlie).get(f"/w/team-a/replicas/{replica.pk}/").status_code == 404


# -- the console's inference profiles --------------------------------------------------------------


def test_admins_create_edit_and_publish_inference_profiles(world: World, signed_in: SignedIn) -> None:
    admin = signed_in(world.admin)
    new = "/console/profiles/inference/new/"
    body = {"name": "vllm-h100", "server": "vllm", "gpu_type": "h100", "gpus": "1", "cpu_cores": "8",
            "memory_gb": "64", "concurrency": "16", "scale_up_after_s": "10", "scale_down_after_s": "300",
            "server_args": "--max-model-len 4096\n--dtype half"}  # fmt: skip
    refused = admin.post(new, {**body, "name": "cpu-vllm", "gpus": "0", "gpu_type": ""})
    assert refused.status_code == 400 and "needs a GPU" in error_of(refused.content.decode(), "gpus")
    bad_args = admin.post(new, {**body, "server_args": "--port 9000"})
    assert bad_args.status_code == 400 and error_of(bad_args.content.decode(), "server_args")
    assert admin.post(new, body).status_code == 302
    made = InferenceProfile.objects.get(name="vllm-h100")
    assert made.server_args == ["--max-model-len", "4096", "--dtype", "half"] and not made.published
    listing = admin.get("/console/profiles/").content.decode()
    assert 'id="inference-profiles"' in listing and 'data-profile="vllm-h100"' in listing
    edit = admin.get("/console/profiles/inference/vllm-h100/").content.decode()
    assert "--max-model-len 4096\n--dtype half" in edit
    admin.post("/console/profiles/inference/vllm-h100/publish/", {"published": "true"})
    assert InferenceProfile.objects.get(name="vllm-h100").published
    # Users see it in the new-endpoint form once published; the console is for admins alone.
    assert 'value="vllm-h100"' in signed_in(world.alice).get(NEW).content.decode()
    assert signed_in(world.alice).get("/console/profiles/inference/new/").status_code == 403


def test_an_endpoint_on_gpus_has_its_replicas_gpu_panel(world: World, signed_in: SignedIn) -> None:
    gpu = cpu_profile("llama-gpu", gpu_type="h100", gpus=1)
    made = endpoint(world.team_a, world.alice, gpu)
    alice = signed_in(world.alice)
    page = alice.get(page_of(made)).content.decode()
    assert 'id="gpu-title"' in page and "No telemetry" in page  # declared GPUs measure nothing here
    assert alice.get(f"{page_of(made)}gpu.json").json()["series"] == {}
    cpu = endpoint(world.team_a, world.alice, cpu_profile(), name="small")
    assert 'id="gpu-title"' not in alice.get(page_of(cpu)).content.decode()
