"""The elastic replay (bench/elastic.py): on a cluster that starts at its minimum and grows when work
waits, every job finishes, no work is placed on a node that is not up, the nodes powered stay within
the pool's bounds, and under a light load the autoscaler stops nodes, so fewer node-hours are used
than on the fixed cluster."""

from __future__ import annotations

from dataclasses import replace
from decimal import Decimal
from pathlib import Path
from typing import Any

from apps.scheduling.replay import Job
from apps.scheduling.types import Admit
from bench import synthetic
from bench.elastic import ElasticReplay, Settings, compare

HOUR_S = 3600.0
QUOTAS = {"a": 16, "b": 16}  # 32 GPUs: 4 nodes of 8
SETTINGS = Settings(period_s=60.0, start_delay_s=180.0, scale_down_delay_s=600.0, min_nodes=2, max_nodes=3)


def light_trace() -> list[Job]:
    """Two bursts that need a third node for an hour, with long quiet spells between them and after."""
    jobs: list[Job] = []
    for burst, at in enumerate((0.0, 6 * HOUR_S)):
        for n in range(6):  # 6 x 4 GPUs: 3 nodes' worth
            jobs.append(Job(f"burst{burst}-{n}", at + n, HOUR_S, Decimal(4), "ab"[n % 2], len(jobs)))
    for n in range(20):  # a trickle of small jobs that one node holds
        jobs.append(Job(f"small-{n}", 1800.0 * n, 600.0, Decimal(1), "ab"[n % 2], len(jobs)))
    jobs.append(Job("last", 14 * HOUR_S, 600.0, Decimal(1), "a", len(jobs)))
    return jobs


class Recorded(ElasticReplay):
    """The replay, with every placement noted with the power state of its node at that moment."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.placed: list[tuple[str, str]] = []  # (node, its power when work was placed on it)
        self.powered: list[int] = []  # nodes powered after each cycle

    def _admitted(self, run: Any, admit: Admit, now: float) -> None:
        self.placed += [(replica.node, self.nodes[replica.node].power) for replica in admit.placement]
        super()._admitted(run, admit, now)

    def _autoscale(self, now: float) -> bool:
        changed = super()._autoscale(now)
        self.powered.append(sum(1 for n in self.nodes.values() if n.power != "down"))
        return changed


def test_it_finishes_every_job_on_up_nodes_only_within_the_pools_bounds() -> None:
    run = Recorded(light_trace(), QUOTAS, replace(SETTINGS, elastic=True))
    metrics = run.run()
    assert metrics["finished"] == metrics["jobs"] == len(light_trace())
    assert run.placed and all(power == "up" for _, power in run.placed)
    assert metrics["on_unready_node"] == 0
    assert {node for node, _ in run.placed} <= {"node-0000", "node-0001", "node-0002"}  # never the 4th
    assert run.powered and min(run.powered) >= 2 and max(run.powered) <= 3
    assert (metrics["fewest_nodes_powered"], metrics["most_nodes_powered"]) == (2, 3)


def test_under_a_light_load_it_scales_up_for_the_bursts_and_down_after_them() -> None:
    result = compare(light_trace(), QUOTAS, SETTINGS)
    fixed, elastic = result["fixed"], result["elastic"]
    assert all(result["checks"].values())
    assert elastic["scale_ups"] >= 2 and elastic["nodes_started"] >= 2  # once per burst
    assert elastic["scale_downs"] >= 2 and elastic["nodes_stopped"] >= 2  # after each burst
    assert elastic["node_hours"] < 0.75 * fixed["node_hours"]  # 4 nodes fixed, 2 most of the time
    assert fixed["scale_ups"] == fixed["scale_downs"] == 0 and fixed["mean_nodes_powered"] == 4.0
    # What it costs: work of the bursts waits for the third node to start, or for the maximum's room.
    assert fixed["queueing_s"]["mean"] == 0 < elastic["queueing_s"]["mean"]


def test_a_synthetic_philly_slice_passes_its_checks(tmp_path: Path) -> None:
    jobs, quotas, _ = synthetic.trace_slice(synthetic.write(tmp_path, seed=3, count=300), 0, None, 3)
    result = compare(jobs, quotas, Settings())
    assert all(result["checks"].values())
    assert result["elastic"]["finished"] == result["fixed"]["finished"] == 300
    assert result["elastic"]["node_hours"] < result["fixed"]["node_hours"]
