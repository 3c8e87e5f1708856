"""The trace replay on small traces written here: metrics, fifo against portal, gangs, rejections,
preemption with checkpoints, bad input and determinism."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from dataclasses import replace
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from apps.scheduling.replay import (
    METRIC_KEYS,
    Audit,
    Options,
    Replay,
    build_nodes,
    gang_shape,
    main,
    options_from,
    parser,
    read_cohorts,
    read_quotas,
    read_trace,
)
from apps.scheduling.types import Admit, ReplicaPlacement, Workload

ROOT = Path(__file__).resolve().parents[2]
HEADER = "job_id,submit_time_s,duration_s,num_gpus,team,status"


def write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


def replay(
    tmp_path: Path, jobs: list[str], quotas: list[str], *args: str, header: str = "team,gpus"
) -> tuple[Replay, dict[str, Any]]:
    """Replay `jobs` (CSV rows): the replay, to look at single jobs, and its metrics."""
    trace = write(tmp_path / "jobs.csv", [HEADER, *jobs])
    quota = write(tmp_path / "quotas.csv", [header, *quotas])
    argv = ["--trace", str(trace), "--quotas", str(quota), "--json", "-", *args]
    options = replace(options_from(parser().parse_args(argv)), cohorts=read_cohorts(quota))
    run = Replay(read_trace(trace), read_quotas(quota), options)
    return run, run.run()


def started(run: Replay, job_id: str) -> float:
    progress = run.progress[job_id]
    assert progress.finished_at is not None
    return progress.finished_at - progress.job.duration_s


# --- output -----------------------------------------------------------------------------------


def test_it_writes_every_metric_and_only_those(tmp_path: Path) -> None:
    trace = write(tmp_path / "jobs.csv", [HEADER, "j1,0,100,1,a,unknown", "j2,10,50,2,b,unknown"])
    quotas = write(tmp_path / "quotas.csv", ["team,gpus", "a,4", "b,4"])
    out = tmp_path / "out.json"

    assert main(["--trace", str(trace), "--quotas", str(quotas), "--gpus-per-node", "4", "--json", str(out)]) == 0

    result = json.loads(out.read_text())
    assert list(result) == list(METRIC_KEYS)
    assert result["jobs"] == 2
    assert result["avg_jct_s"] == 75.0  # nobody waited on an idle cluster
    assert result["avg_duration_s"] == 75.0
    assert result["p99_wait_s"] == 0.0
    assert result["makespan_s"] == 100.0
    assert result["gpu_utilization"] == pytest.approx((100 * 1 + 50 * 2) / (8 * 100))


def test_it_shows_its_help_with_examples(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    assert "examples:" in capsys.readouterr().out


# --- fifo against portal ----------------------------------------------------------------------


def test_fifo_blocks_at_the_head_of_a_queue_while_portal_backfills_and_borrows(tmp_path: Path) -> None:
    jobs = [
        "a1,0,1000,4,a,unknown",  # half of a's quota, for a long time
        "a2,10,100,8,a,unknown",  # a's whole quota: has to wait for a1 under fifo
        "a3,20,100,1,a,unknown",  # fits a's remaining quota, but is behind a2
    ]
    quotas = ["a,8", "b,8"]  # b is idle: its quota can be lent

    fifo, fifo_result = replay(tmp_path, jobs, quotas, "--policy", "fifo")
    portal, portal_result = replay(tmp_path, jobs, quotas, "--policy", "portal")

    assert started(fifo, "a2") == 1000  # when a1 gives back its quota
    assert started(fifo, "a3") == 1100  # the queue is blocked behind a2 until then
    assert started(portal, "a2") == 10  # borrows b's idle quota
    assert started(portal, "a3") == 20
    assert portal_result["avg_jct_s"] < fifo_result["avg_jct_s"]
    for result in (fifo_result, portal_result):
        assert result["quota_violations"] == 0


@pytest.mark.parametrize("policy", ["fifo", "portal"])
def test_a_team_queue_follows_submit_time_not_the_order_of_the_file(tmp_path: Path, policy: str) -> None:
    jobs = [
        "first,0,1000,8,a,unknown",  # holds a's whole quota until 1000
        "late,100,100,8,a,unknown",  # listed before `early`, submitted after it
        "early,50,100,8,a,unknown",
    ]
    run, _ = replay(tmp_path, jobs, ["a,8"], "--policy", policy)
    assert started(run, "early") == 1000
    assert started(run, "late") == 1100


def test_portal_backfills_past_a_gang_that_does_not_fit_yet(tmp_path: Path) -> None:
    jobs = ["a1,0,1000,4,a,unknown", "a2,10,100,16,a,unknown", "a3,20,100,1,a,unknown"]

    portal, portal_result = replay(tmp_path, jobs, ["a,16"], "--policy", "portal")

    assert started(portal, "a3") == 20  # does not wait behind the 16-GPU gang
    assert started(portal, "a2") == 1000  # the gang needs both nodes whole


# --- gangs ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("num", "shape"),
    [("0.5", (1, "0.5")), ("0.333", (1, "0.333")), ("0.33333", (1, "0.333")), ("0.0001", (1, "0.001")),
     ("1", (1, "1")), ("8", (1, "8")), ("12", (2, "6")),
     ("16", (2, "8")), ("24", (3, "8")), ("20", (3, "7")), ("1.5", (1, "2"))],
)  # fmt: skip
def test_it_splits_a_job_into_replicas_that_each_fit_a_node(num: str, shape: tuple[int, str]) -> None:
    replicas, per_replica = gang_shape(Decimal(num), 8)

    assert (replicas, per_replica) == (shape[0], Decimal(shape[1]))
    assert per_replica <= 8


def test_a_gang_is_never_partial(tmp_path: Path) -> None:
    jobs = [f"g{i},{i * 5},{300 + 37 * i},{[16, 12, 24, 8, 4, 1][i % 6]},t{i % 3},unknown" for i in range(30)]

    for policy in ("fifo", "portal"):
        run, result = replay(tmp_path, jobs, ["t0,24", "t1,24", "t2,24"], "--policy", policy)
        assert result["partial_gangs"] == 0
        assert result["rejected"] == 0
        assert all(p.finished_at is not None for p in run.progress.values())


def test_the_audit_counts_a_partial_gang_and_an_overallocated_device() -> None:
    nodes = build_nodes(16, 8)
    audit = Audit({"a": 16}, nodes, borrowing=False)
    gang = Workload("g", "a", "gpu", Decimal(8), replicas=2)
    whole = tuple((i, Decimal(1)) for i in range(8))

    audit.admit(Admit("g", "trace", (ReplicaPlacement("node-0000", whole),)), gang)  # one replica of two
    assert audit.partial_gangs == 1
    audit.admit(Admit("h", "trace", (ReplicaPlacement("node-0000", ((0, Decimal("0.5")),)),)),
                Workload("h", "a", "gpu", Decimal("0.5")))  # fmt: skip
    assert audit.partial_gangs == 2  # device 0 of node-0000 was already whole in use


def test_the_audit_counts_use_beyond_quota_without_borrowing() -> None:
    audit = Audit({"a": 1, "b": 1}, build_nodes(2, 8), borrowing=False)

    audit.admit(Admit("x", "trace", (ReplicaPlacement("node-0000", ((0, Decimal(1)), (1, Decimal(1)))),)),
                Workload("x", "a", "gpu", Decimal(2)))  # fmt: skip

    assert audit.quota_violations == 1
    assert audit.partial_gangs == 0


# --- rejections -------------------------------------------------------------------------------


def test_a_job_no_policy_could_ever_run_is_rejected_not_waited_for(tmp_path: Path) -> None:
    jobs = ["big,0,100,64,a,unknown", "ok,0,100,1,a,unknown", "over,5,100,12,a,unknown", "nobody,5,100,1,x,unknown"]
    quotas = ["a,8", "b,8"]

    fifo, fifo_result = replay(tmp_path, jobs, quotas, "--policy", "fifo")
    portal, portal_result = replay(tmp_path, jobs, quotas, "--policy", "portal")

    # fifo: 64 > the cluster, 12 > a's quota, and x has no quota at all.
    assert fifo_result["rejected"] == 3
    assert fifo_result["avg_jct_s"] == 100.0
    # portal: only the job bigger than the whole cluster; the others borrow.
    assert portal_result["rejected"] == 1
    assert portal.progress["over"].finished_at is not None
    assert portal.progress["nobody"].finished_at is not None


# --- preemption -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("interval", "finished_at"),
    [
        ("1800", 5100 + 120 + (10_000 - 3600)),  # two whole checkpoints kept: 3,600 s of work
        ("0", 5100 + 120 + 10_000),  # no checkpoints: starts over
    ],
)
def test_a_preempted_job_resumes_from_its_last_checkpoint_after_a_restart_cost(
    tmp_path: Path, interval: str, finished_at: float
) -> None:
    jobs = [
        "borrower,0,10000,16,b,unknown",  # b's 8 GPUs and 8 borrowed from a
        "owner,5000,100,8,a,unknown",  # a wants its quota back
    ]
    args = (
        "--policy",
        "portal",
        "--checkpoint-interval-s",
        interval,
        "--restart-cost-s",
        "120",
        "--min-runtime-s",
        "600",
    )

    run, result = replay(tmp_path, jobs, ["a,8", "b,8"], *args)

    assert result["preemptions"] == 1
    assert started(run, "owner") == 5000
    assert run.progress["borrower"].finished_at == finished_at
    assert result["quota_violations"] == 0


def test_a_job_is_preempted_only_once_it_has_run_min_runtime(tmp_path: Path) -> None:
    jobs = ["borrower,0,10000,16,b,unknown", "owner,5000,100,8,a,unknown"]

    run, result = replay(tmp_path, jobs, ["a,8", "b,8"], "--policy", "portal", "--min-runtime-s", "7200")

    assert result["preemptions"] == 1
    assert started(run, "owner") == 7200  # a cycle runs when the borrower turns 2 hours, though nothing arrives
    assert run.progress["borrower"].finished_at == 7300 + 120 + (10_000 - 7200)  # four whole checkpoints kept


# --- bad input --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (["job_id,submit_time_s,duration_s,team", "j1,0,10,a"], "missing column(s) num_gpus"),
        ([HEADER, "j1,0,ten,1,a,unknown"], "line 2: duration_s must be a number, got 'ten'"),
        ([HEADER, "j1,0,10,1,a,unknown", "j2,-5,10,1,a,unknown"], "line 3: submit_time_s must be at least 0"),
        ([HEADER, "j1,0,10,0,a,unknown"], "num_gpus must be above 0"),
        ([HEADER, "j1,0,10,1,a,unknown", "j1,1,10,1,a,unknown"], "job_id 'j1' appears twice"),
    ],
)
def test_bad_trace_input_gives_a_clear_message_and_a_nonzero_exit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], lines: list[str], message: str
) -> None:
    trace = write(tmp_path / "jobs.csv", lines)
    quotas = write(tmp_path / "quotas.csv", ["team,gpus", "a,8"])

    code = main(["--trace", str(trace), "--quotas", str(quotas), "--json", str(tmp_path / "out.json")])

    assert code != 0
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out.json").exists()


def test_bad_quotas_from_the_command_line_give_one_line_and_no_traceback(tmp_path: Path) -> None:
    trace = write(tmp_path / "jobs.csv", [HEADER, "j1,0,10,1,a,unknown"])
    quotas = write(tmp_path / "quotas.csv", ["team,gpus", "a,-8"])

    done = subprocess.run(
        [sys.executable, "-m", "apps.scheduling.replay", "--trace", str(trace), "--quotas", str(quotas), "--json", "-"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip

    assert done.returncode == 2
    assert done.stderr == f"replay: error: {quotas} line 2: gpus must be at least 0, got '-8'\n"
    assert done.stdout == ""


@pytest.mark.parametrize(
    ("option", "message"),
    [
        (["--gpus-per-node", "0"], "--gpus-per-node must be at least 1"),
        (["--restart-cost-s", "-1"], "--restart-cost-s must be a finite number at least 0"),
        (["--checkpoint-interval-s", "nan"], "--checkpoint-interval-s must be a finite number at least 0"),
    ],
)
def test_bad_options_give_a_clear_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], option: list[str], message: str
) -> None:
    trace = write(tmp_path / "jobs.csv", [HEADER, "j1,0,10,1,a,unknown"])
    quotas = write(tmp_path / "quotas.csv", ["team,gpus", "a,8"])

    assert main(["--trace", str(trace), "--quotas", str(quotas), "--json", "-", *option]) == 2
    assert capsys.readouterr().err == f"replay: error: {message}\n"


def test_a_missing_file_is_reported_without_a_traceback(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    quotas = write(tmp_path / "quotas.csv", ["team,gpus", "a,8"])

    assert main(["--trace", str(tmp_path / "nope.csv"), "--quotas", str(quotas), "--json", "-"]) == 2
    assert "nope.csv: No such file or directory" in capsys.readouterr().err


# --- determinism and invariants on a random trace ---------------------------------------------


def random_trace(seed: int, count: int) -> list[str]:
    rng = random.Random(seed)
    rows, now = [], 0
    for i in range(count):
        now += rng.choice((0, 0, 1, 30, 200))
        gpus = rng.choice(("0.25", "0.5", "1", "1", "1", "2", "4", "8", "16", "24"))
        team = rng.choice(("a", "a", "b", "c", "d"))  # d has no quota: it may only borrow
        rows.append(f"r{i},{now},{rng.randint(1, 3000)},{gpus},{team},unknown")
    return rows


def test_two_runs_give_the_same_result_and_keep_the_books_straight(tmp_path: Path) -> None:
    jobs, quotas = random_trace(7, 400), ["a,16", "b,8", "c,8"]
    results, runs = {}, {}
    for policy in ("fifo", "portal", "shared"):
        runs[policy], first = replay(tmp_path, jobs, quotas, "--policy", policy, "--min-runtime-s", "60")
        _, second = replay(tmp_path, jobs, quotas, "--policy", policy, "--min-runtime-s", "60")
        for result in (first, second):
            del result["engine_cpu_s"], result["admissions_per_s"]
        assert first == second
        assert first["quota_violations"] == 0
        assert first["partial_gangs"] == 0
        results[policy] = first
    assert results["portal"]["preemptions"] > 0  # the trace does exercise preemption
    # fifo rejects what a hard quota can never hold (d has none): compare on the jobs all ran.
    ran = [job_id for job_id, progress in runs["fifo"].progress.items() if progress.finished_at is not None]
    assert 200 < len(ran) < 400

    def mean_jct(run: Replay) -> float:
        return sum(run.progress[j].finished_at - run.progress[j].job.submit_s for j in ran) / len(ran)  # type: ignore[operator]

    assert mean_jct(runs["portal"]) < mean_jct(runs["fifo"])
    assert mean_jct(runs["portal"]) < mean_jct(runs["shared"])


def test_limit_replays_the_first_jobs_of_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = write(tmp_path / "jobs.csv", [HEADER, *random_trace(3, 50)])
    quotas = write(tmp_path / "quotas.csv", ["team,gpus", "a,16", "b,8", "c,8"])

    assert main(["--trace", str(trace), "--quotas", str(quotas), "--json", "-", "--limit", "10"]) == 0

    assert json.loads(capsys.readouterr().out)["jobs"] == 10


def test_the_options_reach_the_policy() -> None:
    args = parser().parse_args(["--trace", "t", "--quotas", "q", "--json", "-", "--max-scan", "7", "--no-preemption"])

    options = options_from(args)

    assert isinstance(options, Options)
    assert options.policy.max_scan == 7
    assert options.policy.preemption is False


# --- cohorts, per-workspace waits, the shared queue, the period ----------------------------------


def test_teams_lend_and_borrow_only_within_their_cohort(tmp_path: Path) -> None:
    jobs = ["a16,0,100,16,a,unknown", "b16,0,100,16,b,unknown"]

    run, result = replay(tmp_path, jobs, ["a,8,x", "b,8,y", "c,8,x"], header="team,gpus,cohort")

    assert started(run, "a16") == 0  # borrows c's idle 8 GPUs: same cohort
    assert result["rejected"] == 1  # b's cohort is b alone: 16 GPUs can never be its
    assert "b16" not in run.first_start


def test_the_audit_checks_borrowing_cohort_by_cohort() -> None:
    """A team above its quota is covered only by idle quota of its own cohort: the audit finds a
    violation the single-cohort rule would let pass."""
    two = tuple((i, Decimal(1)) for i in range(2))
    admit = Admit("x", "trace", (ReplicaPlacement("node-0000", two),))
    workload = Workload("x", "a", "gpu", Decimal(2))

    one_cohort = Audit({"a": 1, "b": 1}, build_nodes(2, 8), borrowing=True)
    one_cohort.admit(admit, workload)
    apart = Audit({"a": 1, "b": 1}, build_nodes(2, 8), borrowing=True, cohorts={"a": "x", "b": "y"})
    apart.admit(admit, workload)

    assert one_cohort.quota_violations == 0
    assert apart.quota_violations == 1


def test_per_workspace_waits_are_first_start_minus_submit(tmp_path: Path) -> None:
    jobs = ["j1,0,100,1,a,unknown", "j2,0,100,1,a,unknown", "j3,10,50,1,b,unknown"]

    _, result = replay(tmp_path, jobs, ["a,1", "b,0"], "--policy", "fifo")

    assert result["per_workspace"] == {
        "a": {"jobs": 2, "mean_wait_s": 50.0, "p95_wait_s": 100.0, "max_wait_s": 100.0},
        "b": {"jobs": 1, "mean_wait_s": 0.0, "p95_wait_s": 0.0, "max_wait_s": 0.0},  # rejected: no quota
    }


def test_the_shared_policy_is_one_queue_in_submit_order_without_quotas(tmp_path: Path) -> None:
    jobs = ["early,0,100,8,b,unknown", "owner,1,100,8,a,unknown", "guest,2,100,1,c,unknown"]

    run, result = replay(tmp_path, jobs, ["a,8", "b,0"], "--policy", "shared")

    assert result["rejected"] == 0  # b and c have no quota: shared has none to refuse them
    assert started(run, "early") == 0
    assert started(run, "owner") == 100  # behind b's job, though the GPUs are a's quota
    assert started(run, "guest") == 200  # the 8 GPUs are the owner's job's until then
    assert result["quota_violations"] == 0 and result["preemptions"] == 0


def test_a_rule_of_time_is_acted_on_at_the_next_period(tmp_path: Path) -> None:
    jobs = ["borrower,0,10000,16,b,unknown", "owner,5000,100,8,a,unknown"]

    run, _ = replay(tmp_path, jobs, ["a,8", "b,8"], "--min-runtime-s", "7201", "--interval-s", "10")

    assert started(run, "owner") == 7210  # the first periodic cycle after the borrower turns 7,201 s
