"""How close estimated starts come to what happens: bench/estimates.py's measurement, held to bounds
around what it measured once the estimates followed the nodes for gangs and kept a workspace's use
for its work not yet submitted (docs/benchmarks.md, "Estimated starts against what happened").

Two traces. The first 10,000 jobs of the Philly trace (about 13 s of CPU), read from the folder
named by the environment variable PORTAL_TRACES_DIR, else from ../shared/traces beside the
checkout (bench/estimates.py's default); where neither holds it, that test measures the synthetic
trace instead, so that it never skips. And always, a synthetic trace in the Philly trace's shape
(bench/synthetic.py: 6,000 jobs, seed 1, about 5 s of CPU), written at test time.

Before the line was played forward as the portal admits, on the Philly slice: median error
4,274 s, 90th percentile 32,819 s, 95% of jobs started before their estimate; on the synthetic
trace: median 1,303 s, 90th percentile 5,790.5 s, 7.4% started before their estimate with no
play forward at all, and median 756.25 s, 28.9% before with the strict queue order. Played forward
as the portal admits, counting GPUs only (2026-11-27): Philly slice 784 s, 4,773.5 s, 33.0%;
synthetic 463 s, 5,205.75 s, 22.1%; each of those fails a bound below."""

from __future__ import annotations

import functools
import importlib.util
import os
import sys
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
TRACES = Path(os.environ.get("PORTAL_TRACES_DIR") or ROOT.parent / "shared" / "traces")
PHILLY_JOBS = 10_000
SYNTHETIC_JOBS, SYNTHETIC_SEED = 6_000, 1

# Measured on the Philly slice (2026-11-28): 2,936 jobs waited, all with an estimate; median |start -
# estimate| 771.75 s, 90th percentile 4,471 s, 35.8% started before their estimate.
PHILLY = {"waited_over": 2_500, "median_at_most_s": 1_200.0, "p90_at_most_s": 6_000.0, "before": (0.335, 0.55)}
# Measured on the synthetic trace (2026-11-28): 2,426 jobs waited, all with an estimate; median 459 s,
# 90th percentile 3,963.25 s, 27.2% started before their estimate. The 90th percentile is mostly
# gangs': counted in GPUs and not on nodes it was 4,943 s, so its margin is narrower than the
# others' (the figures are exact: simulated time, a fixed seed), to fail on that.
SYNTHETIC = {"waited_over": 2_000, "median_at_most_s": 600.0, "p90_at_most_s": 4_500.0, "before": (0.24, 0.36)}


def load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"bench_{name}", ROOT / "bench" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@functools.cache
def synthetic_result() -> dict[str, Any]:
    """The synthetic trace's measurement, once per test run (both tests may ask for it)."""
    with tempfile.TemporaryDirectory() as folder:
        traces = load("synthetic").write(Path(folder), seed=SYNTHETIC_SEED, count=SYNTHETIC_JOBS)
        result: dict[str, Any] = load("estimates").measure(traces, [])
    assert result["jobs"] == SYNTHETIC_JOBS
    return result


def check(result: dict[str, Any], bounds: dict[str, Any]) -> None:
    metrics = result["metrics"]
    assert metrics["estimated_starts"] > bounds["waited_over"] and metrics["unknown_starts"] == 0
    assert metrics["p50_estimate_error_s"] <= bounds["median_at_most_s"]
    assert metrics["p90_estimate_error_s"] <= bounds["p90_at_most_s"]
    low, high = bounds["before"]
    assert low <= result["started_before_estimate"] <= high


def test_estimates_on_a_slice_of_the_philly_trace_stay_within_their_recorded_bounds() -> None:
    if not (TRACES / "philly_vc_jobs.csv").exists():  # no Philly trace here: the synthetic one stands in
        check(synthetic_result(), SYNTHETIC)
        return
    result = load("estimates").measure(TRACES, [], limit=PHILLY_JOBS)
    assert result["jobs"] == PHILLY_JOBS
    check(result, PHILLY)


def test_estimates_on_a_synthetic_trace_stay_within_their_recorded_bounds() -> None:
    check(synthetic_result(), SYNTHETIC)
