"""Hard limits hold under concurrent requests: the workspace row is locked while counting."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from apps.compute.models import Instance
from tests.personas import World, api_token

pytestmark = pytest.mark.slow  # real processes: run first (tests/conftest.py)


def test_it_accepts_exactly_max_instances_of_20_parallel_launches(tx_world: World, live_server) -> None:
    assert tx_world.team_a.max_instances == 3
    headers = {"Authorization": f"Token {api_token(tx_world.alice)}"}

    def launch(n: int) -> requests.Response:
        body = {"workspace": "team-a", "name": f"box-{n}", "profile": "cpu-small"}
        return requests.post(f"{live_server.url}/api/v1/instances/", json=body, headers=headers, timeout=60)

    with ThreadPoolExecutor(max_workers=20) as pool:
        responses = list(pool.map(launch, range(20)))

    accepted = [r for r in responses if r.status_code == 201]
    refused = [r for r in responses if r.status_code == 409]
    assert len(accepted) == 3, [r.status_code for r in responses]
    assert len(refused) == 17
    for response in refused:
        error = response.json()["error"]
        assert error["code"] == "limit_exceeded"
        assert "already has 3 instances, its limit" in error["message"]
    assert Instance.objects.filter(workspace=tx_world.team_a).count() == 3


def test_1000_concurrent_submissions_are_each_recorded_once_and_admitted_within_quota(
    tx_world: World, live_server, settings
) -> None:
    from decimal import Decimal

    from apps.inventory.models import Allocation
    from apps.jobs.models import Job
    from apps.scheduling.adapter import run_cycle

    settings.PORTAL_SCHEDULER_TRIGGER = "off"  # one cycle after the burst, not one per request
    headers = {"Authorization": f"Token {api_token(tx_world.alice)}"}

    def submit(n: int) -> requests.Response:
        body = {"workspace": "team-a", "name": f"burst-{n}", "command": "true", "gpu_type": "h100",
                "gpus_per_replica": "1"}  # fmt: skip
        return requests.post(f"{live_server.url}/api/v1/jobs/", json=body, headers=headers, timeout=120)

    with ThreadPoolExecutor(max_workers=50) as pool:
        responses = list(pool.map(submit, range(1000)))
    run_cycle()

    assert [r.status_code for r in responses if r.status_code != 201] == []
    names = list(Job.objects.filter(workspace=tx_world.team_a).values_list("name", flat=True))
    assert len(names) == 1000 and len(set(names)) == 1000
    held = sum(
        Allocation.objects.filter(workload__workspace=tx_world.team_a).values_list("fraction", flat=True), Decimal(0)
    )
    admitted = Job.objects.filter(workspace=tx_world.team_a, state=Job.State.ADMITTED).count()
    assert held == admitted == 4  # team-a's quota: 4 h100; the rest wait their turn


def test_submissions_to_one_workspace_do_not_wait_for_each_other_but_a_policy_change_waits(tx_world: World) -> None:
    """A submission holds its workspace's policies (max runtime) until it commits: an admin's change
    waits for it, while other submissions to the workspace go on."""
    import threading

    from django.db import OperationalError, connection, transaction

    from apps.jobs.actions import check_submit_job
    from apps.workspaces.models import Workspace

    held, release = threading.Event(), threading.Event()

    def slow_submission() -> None:
        try:
            with transaction.atomic():
                check_submit_job(tx_world.team_a, name="slow", command="true", acting_user=tx_world.alice)
                held.set()
                release.wait(30)
        finally:
            connection.close()

    def other(action: str) -> str:
        try:
            with transaction.atomic():
                with connection.cursor() as cursor:
                    cursor.execute("SET LOCAL lock_timeout = '2s'")
                if action == "submit":
                    check_submit_job(tx_world.team_a, name="quick", command="true", acting_user=tx_world.alice)
                else:
                    Workspace.objects.filter(pk=tx_world.team_a.pk).update(max_runtime_s=60)
            return "done"
        except OperationalError as error:
            return "waited" if "lock timeout" in str(error) else repr(error)
        finally:
            connection.close()

    first = threading.Thread(target=slow_submission)
    first.start()
    try:
        assert held.wait(30)
        with ThreadPoolExecutor(max_workers=1) as pool:
            assert pool.submit(other, "submit").result() == "done"
            assert pool.submit(other, "policy").result() == "waited"
    finally:
        release.set()
        first.join()
