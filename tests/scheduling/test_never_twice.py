"""No workload is both admitted and evicted in one cycle, whatever the minimum runtime: an admission
and a preemption of the same workload leaving one cycle together gave its devices twice (the
preemption of a still-queued workload does nothing, the admission then went ahead)."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from apps.scheduling.engine import Policy, ReplicaPlacement, Snapshot, Workload, schedule
from tests.scheduling.builders import ws
from tests.scheduling.test_engine import D, job, node, snapshots


@settings(max_examples=400, deadline=None, database=None)
@given(snapshots(crowded=True), st.sampled_from([0.0, 0.0, 600.0]))
def test_no_workload_is_admitted_and_evicted_in_one_cycle(snap: Snapshot, min_runtime_s: float) -> None:
    decisions = schedule(replace(snap, policy=replace(snap.policy, min_runtime_s=min_runtime_s)))
    assert not {a.key for a in decisions.admitted} & {p.key for p in decisions.preempted}


def test_work_admitted_in_this_cycle_is_no_victim_even_without_a_minimum_runtime() -> None:
    """A case the search above found: w2 borrows half a device for job:6; later in the pass w1's
    job:5, within its quota, looks for victims and took job:6, admitted moments before."""

    def run(key: str, workspace: str, gpus: str, *devices: int, replicas: int = 1) -> Workload:
        placement = tuple(ReplicaPlacement("n0", ((d, D(gpus)),)) for d in devices)
        return replace(job(key, workspace, gpus, replicas), cluster="east" if devices else None, placement=placement)

    snap = Snapshot(
        (ws("w0", "8", cohort="lab"), ws("w1", "4", cohort="lab"), ws("w2", "0", cohort="lab", can_borrow=True)),
        (node("n0", "0", "0", "0", "0", "0.5", "1", cluster="east"),),
        (run("running:0", "w0", "0.5", 0), run("running:1", "w0", "0.5", 0), run("running:2", "w0", "0.5", 1),
         run("running:3", "w0", "1", 2), run("running:4", "w0", "1", 3),
         run("running:5", "w1", "0.5", 1, 4, replicas=2), run("running:6", "w1", "2")),
        (job("job:0", "w0", "0"), job("job:1", "w0", "0"), job("job:2", "w0", "0.25"),
         job("job:3", "w1", "0.25", seq=1), job("job:4", "w0", "0.25", 3), job("job:5", "w1", "2"),
         job("job:6", "w2", "0.5")),
        now=1000.0,
        policy=Policy(min_runtime_s=0.0),
    )  # fmt: skip
    decisions = schedule(snap)
    assert "job:6" in {a.key for a in decisions.admitted}
    assert "job:6" not in {p.key for p in decisions.preempted}
