"""A synthetic trace in the Philly trace's CSV shape, the same for the same seed.

    .venv/bin/python bench/synthetic.py FOLDER [--seed N] [--jobs N]

Writes FOLDER/philly_vc_jobs.csv (job_id,submit_time_s,duration_s,num_gpus,team,status) and
FOLDER/philly_vc_quota.csv (team,gpus), the files `bench/estimates.py --traces FOLDER` and the
replay read. What it models of the Philly trace (docs/benchmarks.md, "Estimated starts against
what happened"): arrivals that come and go with the time of day; 1, 2, 4 or 8 GPUs, mostly 1;
runtimes with a heavy tail (log-normal: a median of minutes, a few running for days); a few
virtual clusters with quotas of 16 to 64 GPUs, one of which submits 60% of the jobs on a fifth
of the quotas, so that it borrows and its work is reclaimed. The offered load is about the
cluster's size, so that a good share of the jobs wait.
"""

from __future__ import annotations

import argparse
import csv
import math
import random
import sys
import tempfile
from pathlib import Path
from typing import Any

# (team, quota in GPUs, share of the jobs): five virtual clusters, 160 GPUs (20 nodes of 8); the first
# far beyond its quota, as the Philly trace's busiest team.
TEAMS = (("vc-a", 32, 0.60), ("vc-b", 64, 0.15), ("vc-c", 32, 0.12), ("vc-d", 16, 0.08), ("vc-e", 16, 0.05))
SIZES = ((1, 0.82), (2, 0.08), (4, 0.06), (8, 0.04))  # (GPUs, share of the jobs)
MEDIAN_RUNTIME_S, RUNTIME_SIGMA, LONGEST_S = 900.0, 1.7, 5 * 86_400.0
LOAD = 1.0  # offered GPU-seconds per second, as a multiple of the cluster's GPUs
DAY_S = 86_400.0


def jobs(seed: int, count: int) -> list[tuple[str, int, int, int, str]]:
    """`count` jobs (id, submit second, duration in seconds, GPUs, team) in submission order."""
    rng = random.Random(seed)
    gpus = sum(quota for _, quota, _ in TEAMS)
    mean_size = sum(size * share for size, share in SIZES)
    mean_runtime = MEDIAN_RUNTIME_S * math.exp(RUNTIME_SIGMA**2 / 2)  # the log-normal's mean (tail not cut)
    rate = LOAD * gpus / (mean_size * mean_runtime)  # jobs per second, on average over a day
    names = [team for team, _, _ in TEAMS]
    weights = [share for _, _, share in TEAMS]
    sizes = [size for size, _ in SIZES]
    size_weights = [share for _, share in SIZES]
    made: list[tuple[str, int, int, int, str]] = []
    now = 0.0
    for n in range(count):
        busy = 1.0 + 0.6 * math.sin(2 * math.pi * now / DAY_S)  # busier by day than by night
        now += rng.expovariate(rate * busy)
        duration = min(LONGEST_S, rng.lognormvariate(math.log(MEDIAN_RUNTIME_S), RUNTIME_SIGMA))
        size = rng.choices(sizes, size_weights)[0]
        team = rng.choices(names, weights)[0]
        made.append((f"synthetic-{n:06d}", int(now), max(1, int(duration)), size, team))
    return made


def write(folder: Path, *, seed: int = 1, count: int = 6_000) -> Path:
    """Write the trace's two files into `folder` (made if need be); `folder`, for `--traces`."""
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / "philly_vc_jobs.csv").open("w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(("job_id", "submit_time_s", "duration_s", "num_gpus", "team", "status"))
        writer.writerows((*job, "unknown") for job in jobs(seed, count))
    with (folder / "philly_vc_quota.csv").open("w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(("team", "gpus"))
        writer.writerows((team, quota) for team, quota, _ in TEAMS)
    return folder


def trace_slice(traces: Path, skip: int, limit: int | None, seed: int) -> tuple[list[Any], dict[str, int], str]:
    """Jobs `skip` to `skip + limit` of the Philly trace in `traces` (the replay's `Job`s, in
    submission order), its quotas, and where they came from; without the trace there, `limit`
    jobs (6,000 without one) of a synthetic trace of this seed stand in."""
    from apps.scheduling import replay  # the benchmarks that slice a trace put the checkout on the path

    source = f"{traces / 'philly_vc_jobs.csv'}, jobs {skip} to {'the end' if limit is None else skip + limit - 1}"
    if not (traces / "philly_vc_jobs.csv").exists():
        count = limit or 6_000
        traces = write(Path(tempfile.mkdtemp(prefix="trace-")), seed=seed, count=count)
        source, skip = f"bench/synthetic.py, {count} jobs, seed {seed}", 0
    jobs = sorted(replay.read_trace(traces / "philly_vc_jobs.csv"), key=lambda j: j.seq)
    jobs = jobs[skip : None if limit is None else skip + limit]
    jobs.sort(key=lambda j: (j.submit_s, j.seq))
    return jobs, replay.read_quotas(traces / "philly_vc_quota.csv"), source


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("folder", type=Path)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--jobs", type=int, default=6_000)
    args = p.parse_args()
    write(args.folder, seed=args.seed, count=args.jobs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
