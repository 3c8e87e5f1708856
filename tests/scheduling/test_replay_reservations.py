"""The trace replay with reservations: one team's whole devices over a window, placed by the capacity
calendar and handed to the engine each cycle; the holder's start, other teams kept off, the books."""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from apps.scheduling.engine import Engine
from apps.scheduling.replay import (
    Replay,
    ReservationRequest,
    TraceError,
    main,
    options_from,
    parser,
    read_cohorts,
    read_quotas,
    read_trace,
)
from apps.scheduling.types import Admit

HEADER = "job_id,submit_time_s,duration_s,num_gpus,team"
INTERVAL_S = 10.0
START_S, LENGTH_S = 1005.0, 3600.0  # not on the period: the first periodic cycle from it is at 1010
# Two nodes of 8: team b holds one with b1 and borrows the other (the one the calendar reserves for
# a) with b2, until it is evicted for the reservation; a's jobs wait for it from before its start.
JOBS = [
    "b1,0,100000,8,b",
    "b2,10,100000,8,b",
    "a1,500,1800,8,a",
    "a2,1500,600,1,a",
]
QUOTAS = ["team,gpus", "a,8", "b,8"]


def write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


def build(tmp_path: Path, *requests: ReservationRequest, jobs: list[str] = JOBS, quotas: list[str] = QUOTAS) -> Replay:
    trace = write(tmp_path / "jobs.csv", [HEADER, *jobs])
    quota = write(tmp_path / "quotas.csv", quotas)
    argv = ["--trace", str(trace), "--quotas", str(quota), "--json", "-", "--interval-s", str(INTERVAL_S)]
    options = replace(options_from(parser().parse_args(argv)), cohorts=read_cohorts(quota), reservations=requests)
    return Replay(read_trace(trace), read_quotas(quota), options)


def replay(tmp_path: Path, *requests: ReservationRequest) -> tuple[Replay, dict[str, Any]]:
    run = build(tmp_path, *requests)
    return run, run.run()


Runs = dict[str, list[tuple[float, set[tuple[str, int]]]]]


def record_runs(run: Replay, monkeypatch: pytest.MonkeyPatch) -> Runs:
    """Each job's runs as they begin: when, and on which devices (the replay forgets a placement once
    the run ends)."""
    runs: Runs = defaultdict(list)
    admitted = run._admitted

    def spy(progress: Any, admit: Admit, now: float) -> None:
        admitted(progress, admit, now)
        devices = {(replica.node, index) for replica in admit.placement for index, _ in replica.devices}
        runs[progress.job.job_id].append((now, devices))

    monkeypatch.setattr(run, "_admitted", spy)
    return runs


A_HOLDS = ReservationRequest("a", 8, START_S, LENGTH_S)


def test_the_holders_waiting_job_starts_on_the_reserved_devices_within_one_period_of_its_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = build(tmp_path, A_HOLDS)
    runs = record_runs(run, monkeypatch)

    result = run.run()

    (reservation,) = run.reservations
    ((began, where),) = runs["a1"]
    assert START_S <= began <= START_S + INTERVAL_S  # it waited since 500: a's quota was b2's until then
    assert where == set(reservation.devices)
    assert result["reservations"][0]["start_latency_s"] == 1010.0 - START_S


def test_another_teams_long_job_does_not_run_on_the_reserved_devices_across_the_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = build(tmp_path, A_HOLDS)
    runs = record_runs(run, monkeypatch)

    result = run.run()

    (reservation,) = run.reservations
    (first, first_on), (second, _) = runs["b2"]
    assert first == 10 and first_on == set(reservation.devices)  # borrowed them while they were idle
    assert second >= reservation.end  # evicted 60 s before the start, back only once it ended
    assert result["preemptions"] == 1
    assert result["reservations"][0]["overlaps"] == []
    assert result["reservations"][0]["evicted"] == 1
    assert result["quota_violations"] == 0  # a's work on it is not counted against a's 8 GPUs


def test_the_books_count_another_teams_job_on_the_devices_when_the_engine_does_not_keep_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The replay's overlap count is its own, not the engine's word: an engine that is never told
    of the reservation places b1 on the first node, the one the calendar reserved, and leaves it
    there across the start; the books say so."""
    monkeypatch.setattr(Engine, "set_reservations", lambda self, reservations: None)

    _, result = replay(tmp_path, A_HOLDS)

    (held,) = result["reservations"]
    assert held["overlaps"] == ["b1"]
    assert held["holder_first_admitted_at_s"] is None
    assert held["start_latency_s"] > INTERVAL_S  # a1 waited for b2's min_runtime_s to preempt it


def test_the_summary_counts_the_holders_use_evictions_and_the_hours_held(tmp_path: Path) -> None:
    run, result = replay(tmp_path, A_HOLDS)

    (reservation,) = run.reservations
    assert result["reservations"] == [
        {
            "key": "reservation:1",
            "workspace": "a",
            "gpus": 8,
            "nodes": 1,
            "requested_start_s": START_S,
            "start_s": START_S,
            "end_s": START_S + LENGTH_S,
            "holder_waited_at_s": START_S,
            "holder_waiting_job": "a1",
            "holder_waiting_job_started_at_s": 1010.0,
            "start_latency_s": 5.0,
            "holder_first_admitted_at_s": 1010.0,
            "holder_admissions": 2,  # a1 at 1010, then a2 (waiting since 1500) on its devices when a1 ends
            "holder_ordinary_gpus_at_start": 0,
            "evicted": 1,
            "reserved_gpu_h": 8.0,
            "used_gpu_h": round((8 * 1800 + 1 * 600) / 3600, 6),
            "overlaps": [],
        }
    ]
    assert reservation.devices == tuple(("node-0000", i) for i in range(8))


def test_work_on_a_reservation_is_counted_against_quota_only_once_it_ends(tmp_path: Path) -> None:
    """a (8 GPUs of quota, a cohort of its own: it cannot borrow) runs a0 on its quota and a1 on its
    reservation at once: no violation; a1, still running when the reservation ends, then counts."""
    jobs, quotas = ["a0,0,10000,8,a", "a1,1000,5000,8,a"], ["team,gpus,cohort", "a,8,x", "b,8,y"]
    run = build(tmp_path, A_HOLDS, jobs=jobs, quotas=quotas)
    used: list[int] = []
    ended = run.audit.reservation_ended

    def spy(key: str) -> None:
        ended(key)
        used.append(run.audit.used["a"])

    run.audit.reservation_ended = spy  # type: ignore[method-assign]

    result = run.run()

    assert run.first_start == {"a0": 0, "a1": 1010}  # the first period from its start
    assert result["quota_violations"] == 0
    assert used == [16_000]  # both, in thousandths, from the reservation's end
    assert run.audit.used["a"] == 0


def test_the_holders_own_ordinary_work_is_evicted_at_the_start_and_comes_back_inside_the_reservation(
    tmp_path: Path,
) -> None:
    """a0 borrowed the reserved node while it was idle, as a's ordinary work, counted by a's quota: it is
    evicted at the start like anyone's and comes back inside the reservation (a's queue order: a0 was
    first), uncounted; a1 follows it there."""
    run = build(tmp_path, A_HOLDS, jobs=["b1,0,100000,8,b", "a0,5,20000,8,a", "a1,1000,1800,8,a"])

    result = run.run()

    (held,) = result["reservations"]
    assert held["holder_ordinary_gpus_at_start"] == 0 and held["overlaps"] == []
    assert run.first_start["a1"] > START_S + 20000  # after a0's run inside the reservation


def test_a_reservation_is_placed_after_another_on_the_same_devices(tmp_path: Path) -> None:
    """Two reservations of the whole cluster at once: the calendar starts the second when the first ends."""
    first, second = ReservationRequest("a", 16, 2000, 1000, 0), ReservationRequest("b", 16, 2500, 1000, 1)

    run, result = replay(tmp_path, second, first)

    assert [(r.key, r.start, r.end) for r in run.reservations] == [
        ("reservation:1", 2000, 3000),
        ("reservation:2", 3000, 4000),
    ]
    assert [r["requested_start_s"] for r in result["reservations"]] == [2000, 2500]
    assert all(r["overlaps"] == [] for r in result["reservations"])


def test_without_reservations_the_metrics_have_no_reservations_key(tmp_path: Path) -> None:
    _, result = replay(tmp_path)

    assert "reservations" not in result


def test_the_command_line_reads_reservations_from_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = write(tmp_path / "jobs.csv", [HEADER, *JOBS])
    quotas = write(tmp_path / "quotas.csv", QUOTAS)
    reservations = write(tmp_path / "r.csv", ["workspace,gpus,start_time_s,duration_s,gpu_type", "a,8,1005,3600,gpu"])
    argv = ["--trace", str(trace), "--quotas", str(quotas), "--json", "-", "--interval-s", "10"]

    assert main([*argv, "--reservations", str(reservations)]) == 0

    (held,) = json.loads(capsys.readouterr().out)["reservations"]
    assert (held["workspace"], held["gpus"], held["start_s"], held["start_latency_s"]) == ("a", 8, 1005.0, 5.0)


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("a,8,0,3600,tpu", "gpu_type must be 'gpu'"),
        ("a,1.5,0,3600,gpu", "gpus must be a whole number"),
        ("a,8,0,0,gpu", "duration_s must be above 0"),
        ("nobody,8,0,3600,gpu", "workspace 'nobody' has no quota and no jobs"),
        ("a,32,0,3600,gpu", "asks for 32 GPUs, the cluster has 16"),
    ],
)
def test_bad_reservations_give_one_line_and_exit_status_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], row: str, message: str
) -> None:
    trace = write(tmp_path / "jobs.csv", [HEADER, *JOBS])
    quotas = write(tmp_path / "quotas.csv", QUOTAS)
    reservations = write(tmp_path / "r.csv", ["workspace,gpus,start_time_s,duration_s,gpu_type", row])
    argv = ["--trace", str(trace), "--quotas", str(quotas), "--json", "-", "--reservations", str(reservations)]

    assert main(argv) == 2

    err = capsys.readouterr().err
    assert err.startswith("replay: error:") and message in err and "Traceback" not in err
    assert TraceError.__name__ not in err
