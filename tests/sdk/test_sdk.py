"""The Python SDK against a live embedded portal, over real HTTP, as a notebook or script uses it."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

import pytest
from gpuportal import (
    AuthenticationError,
    Client,
    Conflict,
    LimitExceeded,
    NotFound,
    PortalUnreachable,
    ValidationError,
    WorkloadFailed,
)

from tests.sdk.conftest import LivePortal, until, wait_for

pytestmark = pytest.mark.slow


def test_jobs_from_keywords_a_dict_and_a_yaml_file_run_and_give_back_logs_and_artifacts(
    portal_client: Client, tmp_path: Path
) -> None:
    gang = portal_client.jobs.submit(
        name="gang",
        workspace="demo-team",
        command='echo "rank $RANK of $WORLD_SIZE"; mkdir -p out; echo "from $RANK" > out/rank-$RANK.txt',
        gpus=1,
        replicas=2,
        artifacts=["out"],
    )
    # h100: the workspace's only type
    assert (gang.gpu_type, gang.replicas, gang.gpus) == ("h100", 2, "1 × H100 on each of 2 replicas")
    failing = portal_client.jobs.submit({"name": "fails", "workspace": "demo-team", "command": "exit 4"})
    (tmp_path / "hello.sh").write_text("echo hello from $PORTAL_JOB_KEY\n")
    (tmp_path / "hello.yaml").write_text("workspace: demo-team\nscript: hello.sh\n")
    scripted = portal_client.jobs.submit(tmp_path / "hello.yaml")
    assert scripted.name == "hello"  # named after its script

    assert gang.wait(timeout=60, check=True) is gang
    assert (gang.state, gang.exit_code, gang.is_final, gang.succeeded) == ("SUCCEEDED", 0, True, True)
    assert [gang.logs(replica=r) for r in (0, 1)] == ["rank 0 of 2\n", "rank 1 of 2\n"]
    assert list(gang.stream_logs(replica=1)) == ["rank 1 of 2\n"]
    saved = gang.download_artifacts(tmp_path / "results")
    assert sorted(p.relative_to(tmp_path / "results").as_posix() for p in saved) == ["out/rank-0.txt", "out/rank-1.txt"]
    assert (tmp_path / "results" / "out" / "rank-1.txt").read_text() == "from 1\n"

    with pytest.raises(WorkloadFailed, match=f"Job {failing.id} FAILED with exit code 4"):
        failing.wait(timeout=60, check=True)
    assert failing.exit_code == 4
    assert scripted.wait(timeout=60).logs() == f"hello from job-{scripted.id}\n"

    assert repr(gang) == f"<Job {gang.id} gang SUCCEEDED exit code 0>"
    html = gang._repr_html_()
    assert "SUCCEEDED" in html and "1 × H100 on each of 2 replicas" in html and "out/rank-0.txt" in html
    listed = portal_client.jobs.list("demo-team", state="SUCCEEDED")
    assert gang.id in [job.id for job in listed]
    assert "<table>" in listed._repr_html_()


def test_a_queued_job_and_instance_show_their_place_and_reason_in_a_notebook(portal_client: Client) -> None:
    # It declares its runtime: without one, or earlier runs of its name, the waiter's start is unknown.
    hog = portal_client.jobs.submit(name="hog", workspace="demo", command="sleep 300", gpus=1, max_runtime="10m")
    try:
        wait_for(portal_client, hog.id, lambda job: job.state == "RUNNING")
        waiter = portal_client.jobs.submit(name="waiter", workspace="demo", command="true", gpus=1)
        wait_for(portal_client, waiter.id, lambda job: job.queue_info.position is not None)
        waiter.refresh()
        reason = "waiting for quota: 1 of 1 h100 in use in workspace demo, this needs 1"
        assert waiter.queue is not None
        assert (waiter.queue.position, waiter.queue.reason) == (1, reason)
        assert waiter.queue.estimated_start_at is not None
        assert repr(waiter) == f"<Job {waiter.id} waiter QUEUED position 1: {reason}>"
        html = waiter._repr_html_()
        assert "QUEUED" in html and "1 in its workspace" in html and reason in html
        assert waiter.id in [job.id for job in portal_client.jobs.queue("demo")]

        # An instance that needs the same GPU waits too, and a notebook on it waits for it.
        box = portal_client.instances.create("box", profile="gpu-1", workspace="demo")
        try:
            box = until(lambda: portal_client.instances.get(box.id), lambda i: i.queue_info.position is not None)
            assert (box.state, box.queue is not None, box.queue_info.reason) == ("QUEUED", True, reason)
            lab = box.launch_notebook("lab", profile="minimal")
            assert (lab.state, lab.is_ready, lab.instance) == ("PENDING", False, box.id)
            port = urlsplit(portal_client.url).port
            assert lab.url == f"http://lab-{lab.id}.localhost:{port}/"  # its own host, where it answers once READY
            assert "PENDING" in lab._repr_html_()
            assert lab.id in [n.id for n in portal_client.notebooks.list("demo")]
            lab.delete()
        finally:
            box.delete()
        assert box.refresh().state in ("DELETING", "DELETED")
    finally:
        for job in portal_client.jobs.list("demo", state=["QUEUED", "ADMITTED", "RUNNING"]):
            portal_client.jobs.cancel(job.id)


def test_an_instance_is_created_waited_for_and_deleted(portal_client: Client) -> None:
    instance = portal_client.instances.create("scratch", profile="cpu-small", workspace="demo-team")
    try:
        seen: list[str] = []
        assert instance.wait_ready(timeout=60, on_update=lambda i: seen.append(i.state)) is instance
        assert instance.state == "RUNNING" and instance.is_ready
        assert seen[-1] == "RUNNING"
        assert instance.id in [i.id for i in portal_client.instances.list("demo-team", state="RUNNING")]
    finally:
        instance.delete()
    with pytest.raises(WorkloadFailed, match=f"^Instance {instance.id} is DELET(ING|ED)$"):
        instance.wait_ready(timeout=30)
    assert instance.state in ("DELETING", "DELETED") and not instance.is_ready


def test_errors_are_typed_and_carry_the_portals_message(live_portal: LivePortal, portal_client: Client) -> None:
    with pytest.raises(NotFound, match="Job 999999 was not found"):
        portal_client.jobs.get(999999)
    with pytest.raises(ValidationError) as invalid:
        portal_client.jobs.submit(name="loud", workspace="demo-team", command="true", priority=5000)
    assert invalid.value.status == 400
    assert invalid.value.fields == {"priority": ["Ensure this value is less than or equal to 1000."]}
    with pytest.raises(LimitExceeded, match="can never hold more than 4"):
        portal_client.jobs.submit(name="huge", workspace="demo-team", command="true", gpus=8)
    done = portal_client.jobs.submit(name="quick", workspace="demo-team", command="true").wait(timeout=60)
    with pytest.raises(Conflict, match="has already finished"):
        done.cancel()
    with pytest.raises(AuthenticationError, match="Wrong username or password."):
        Client.login(live_portal.url, "demo", "not-the-password")
    with pytest.raises(AuthenticationError), Client(live_portal.url, "not-a-token") as stranger:
        stranger.me()
    with (
        pytest.raises(PortalUnreachable, match="Cannot reach the portal at http://127.0.0.1:9"),
        Client("http://127.0.0.1:9", "token") as nowhere,
    ):
        nowhere.jobs.list()


def test_defaults_come_from_the_user(live_portal: LivePortal, portal_client: Client) -> None:
    me = portal_client.me()
    assert (me.username, me.private_workspace) == ("demo", "demo")
    assert portal_client.default_workspace() == "demo"
    assert {w.name for w in portal_client.workspaces.list()} == {"demo", "demo-team"}
    assert [q.gpu_type for q in portal_client.workspaces.get("demo-team").gpu_quotas] == ["h100"]
    assert "gpu-1" in [p.name for p in portal_client.profiles.compute()]
    assert "minimal" in [p.name for p in portal_client.profiles.notebooks()]
    with Client(live_portal.url, live_portal.token, workspace="demo-team") as team:
        job = team.jobs.submit(name="where", command="true")
        assert job.workspace == "demo-team"
        job.cancel()
