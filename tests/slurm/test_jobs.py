"""Jobs submitted through the API run for real on Slurm: admitted, started by the worker's path,
finished, cancelled, and found again after a restart of the portal."""

from __future__ import annotations

import re
import subprocess
import time

from apps.jobs.models import Job
from apps.workloads.host import reconcile
from tests.slurm.conftest import Portal, slurm_id, squeue


def test_it_runs_jobs_on_slurm_and_records_their_exit_and_logs(portal: Portal) -> None:
    ok = portal.submit("slurm-ok", 'echo "on $SLURMD_NODENAME rank $RANK of $WORLD_SIZE gpus $CUDA_VISIBLE_DEVICES"')
    failing = portal.submit("slurm-fails", "echo about to fail; echo broken >&2; exit 3")

    for job in (ok, failing):
        assert (job["state"], job["cluster"], job["attempts"]) == ("RUNNING", "slurm", 1)
        assert slurm_id(job["id"]).isdigit()
    ok = portal.settle(ok["id"], "SUCCEEDED", "FAILED")
    failing = portal.settle(failing["id"], "SUCCEEDED", "FAILED")

    assert (ok["state"], ok["exit_code"], ok["failure_reason"]) == ("SUCCEEDED", 0, "")
    assert (failing["state"], failing["exit_code"]) == ("FAILED", 3)
    assert failing["failure_reason"] == "failed with exit code 3"  # Slurm's state FAILED
    assert [(a["exit_code"], a["outcome"]) for a in failing["attempt_history"]] == [(3, "failed")]
    assert re.fullmatch(r"on node[1-4] rank 0 of 1 gpus [0-3]\n", portal.logs(ok["id"]))  # one device, Slurm's pick
    assert portal.logs(failing["id"]) == "about to fail\nbroken\n"
    assert squeue(slurm_id(ok["id"])) == squeue(slurm_id(failing["id"])) == ""


def test_it_runs_a_gang_across_two_slurm_nodes(portal: Portal) -> None:
    command = 'echo "rank=$RANK world=$WORLD_SIZE node=$SLURMD_NODENAME master=$MASTER_ADDR:$MASTER_PORT"'
    gang = portal.submit("slurm-gang", command, replicas=2)
    assert (gang["state"], gang["cluster"]) == ("RUNNING", "slurm")

    gang = portal.settle(gang["id"], "SUCCEEDED", "FAILED")

    assert (gang["state"], gang["exit_code"]) == ("SUCCEEDED", 0)
    lines = [portal.logs(gang["id"], replica).strip() for replica in (0, 1)]
    fields = [dict(pair.split("=", 1) for pair in line.split()) for line in lines]
    assert [(f["rank"], f["world"]) for f in fields] == [("0", "2"), ("1", "2")], lines
    assert fields[0]["node"] != fields[1]["node"], lines  # one replica per node
    assert (
        fields[0]["master"] == fields[1]["master"] == f"{fields[0]['node']}:{20000 + int(slurm_id(gang['id'])) % 20000}"
    )


def test_it_cancels_a_running_slurm_job(portal: Portal) -> None:
    job = portal.submit("slurm-cancel", "echo started; sleep 300")
    running = slurm_id(job["id"])
    assert squeue(running).split()[1:2] == ["RUNNING"]

    job = portal.cancel(job["id"])

    assert job["state"] == "CANCELLED"
    assert squeue(running) == ""
    assert Job.objects.get(pk=job["id"]).backend_stopped is True
    log = portal.logs(job["id"])
    assert log.startswith("started\n") and f"STEP {running}.0 ON " in log and " CANCELLED AT " in log, log
    assert _converged() == (0, 0)  # nothing left to converge


def test_a_restarted_portal_finds_its_slurm_job_by_id_and_records_its_exit(portal: Portal) -> None:
    job_id = portal.submit("slurm-restart", "echo started; sleep 2; echo done; exit 7")["id"]
    running = slurm_id(job_id)

    # The worker that started it kept nothing: reconcile makes new backend objects from the row's
    # backend_state alone, as a restarted portal does.
    assert _converged() == (1, 0)
    assert Job.objects.get(pk=job_id).state == Job.State.RUNNING
    deadline = time.monotonic() + 30
    while squeue(running):  # the job ends while no one watches
        assert time.monotonic() < deadline, squeue(running)
        time.sleep(0.2)
    assert _converged() == (1, 0)

    job = Job.objects.get(pk=job_id)
    assert (job.state, job.exit_code, job.failure_reason) == (Job.State.FAILED, 7, "failed with exit code 7")
    assert job.backend_state["job_id"] == running
    assert sacct_record(running) == f"job-{job_id}|FAILED|7:0"


def sacct_record(slurm_job_id: str, timeout_s: float = 10.0) -> str:
    """The job's accounting record once slurmdbd has it whole (its name comes in last, under load)."""
    deadline = time.monotonic() + timeout_s
    while True:
        argv = ["sacct", "-j", slurm_job_id, "-X", "-n", "-P", "-o", "JobName,State,ExitCode"]
        sacct = subprocess.run(argv, capture_output=True, text=True)
        record = sacct.stdout.strip()
        if record.startswith("job-") or time.monotonic() > deadline:
            return record
        time.sleep(0.2)


def _converged() -> tuple[int, int]:
    """One reconcile: how many workloads it converged, and how many failed."""
    counts = reconcile(sweep=False)
    return counts["converged"], counts["failed"]
