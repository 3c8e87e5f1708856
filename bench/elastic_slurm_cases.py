"""The measurements of bench/elastic_slurm.py, as pytest cases on the suite's fixtures (the world, the
portal on the development Slurm): a gang that needs partition elastic's two powered-down nodes is
submitted, and the time to each step is taken. Not collected by the suite; bench/elastic_slurm.py runs
it and reads what it writes to ``$BENCH_ELASTIC_OUT`` (JSON)."""

from __future__ import annotations

import json
import os
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

from apps.elastic import scaling
from apps.elastic.models import PoolScaling
from apps.inventory.actions import do_register_cluster
from apps.inventory.models import Node
from apps.jobs.models import Job
from apps.scheduling.adapter import run_cycle
from apps.workspaces.models import GPUQuota

# The suite's fixtures, as tests/conftest.py and tests/slurm/conftest.py give them to the tests.
from tests.conftest import (  # noqa: F401
    _fast_password_hashing,
    _fresh_reconcile_backoff,
    _no_disk_outlives_the_test,
    _plain_static_files,
    _scheduler_runs_inline,
    shared_work,
    world,
)
from tests.personas import World
from tests.slurm.conftest import Portal, portal, slurm, slurm_answers, slurm_id, squeue  # noqa: F401
from tests.slurm.test_elastic import NODES, powered_down, slurm_state, until  # noqa: F401

POLL_S = 0.2


def _wait(what: str, predicate: Any, timeout_s: float = 120.0) -> float:
    start = time.monotonic()
    until(what, predicate, timeout_s)
    return time.monotonic() - start


def test_a_gang_from_pending_to_running_on_nodes_powered_up_for_it(  # noqa: F811 (fixtures by name)
    portal: Portal,  # noqa: F811
    world: World,  # noqa: F811
    powered_down: None,  # noqa: F811
    django_capture_on_commit_callbacks: Any,
) -> None:
    elastic = do_register_cluster("elastic", kind="slurm", connection={"partition": "elastic"}, acting_user=world.admin)
    pool = elastic.pools.get()
    PoolScaling.objects.create(pool=pool, provider="slurm", min_nodes=0, max_nodes=2, scale_down_delay_s=0,
                               start_timeout_s=120)  # fmt: skip
    GPUQuota.objects.filter(workspace=world.team_a).update(gpus=Decimal(8))
    runs = []
    for run in range(int(os.environ.get("BENCH_RUNS", "3"))):
        submitted = time.monotonic()
        job = portal.submit(f"gang-{run}", "sleep 2", cluster="elastic", gpus_per_replica="4", replicas=2)
        [change] = scaling.upkeep()  # the scheduler's loop: the cycle ran at submission, then the autoscaler
        decided = time.monotonic()
        while set(Node.objects.filter(pool=pool).values_list("state", flat=True)) != {"ready"}:
            assert time.monotonic() - decided < 120, slurm_state(NODES[0])
            time.sleep(POLL_S)
            scaling.upkeep()
        ready = time.monotonic()
        with django_capture_on_commit_callbacks(execute=True):
            run_cycle()  # admitted, and submitted to Slurm
        while "RUNNING" not in squeue(slurm_id(job["id"])):
            assert time.monotonic() - ready < 60, squeue(slurm_id(job["id"]))
            time.sleep(POLL_S)
        running = time.monotonic()
        portal.settle(job["id"], "SUCCEEDED", "FAILED", timeout_s=60)
        done = time.monotonic()
        assert Job.objects.get(pk=job["id"]).state == "SUCCEEDED"
        # Empty now, and the pool's delay is 0: the next turn of the loop powers them down.
        scaling.upkeep()
        scaling.upkeep()
        stopping = time.monotonic()
        _wait("powered down", lambda: all("POWERED_DOWN" in slurm_state(n) for n in NODES))
        scaling.upkeep()
        down = time.monotonic()
        runs.append({
            "decision_s": decided - submitted, "nodes_ready_s": ready - submitted, "job_running_s": running - submitted,
            "job_done_s": done - submitted, "power_down_s": down - stopping, "nodes": list(change.nodes),
        })  # fmt: skip
    Path(os.environ["BENCH_ELASTIC_OUT"]).write_text(json.dumps({"runs": runs}, indent=2))
