"""Server time of the busiest pages, and of /metrics, with 1,000 jobs and 100 instances in the database.

    DATABASE_URL=postgres://... .venv/bin/python bench/pages.py [--runs 200] [--json bench/out/pages.json]

Makes a throwaway database (test_<name>) on the DATABASE_URL server, fills it through the
actions (1,000 jobs in one team workspace, a third of them finished, and 100 instances), runs one
scheduling cycle so queued jobs carry positions and reasons, then renders each page `--runs`
times through Django's test client as a signed-in member and reports p50 and p95 in ms. The
time is the whole request inside Django (middleware, queries, templates), without a network.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from decimal import Decimal
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
os.environ["PORTAL_SCHEDULER_TRIGGER"] = "off"
os.environ["PORTAL_WORKLOAD_TRIGGER"] = "off"
os.environ.setdefault("LOG_LEVEL", "WARNING")

import django  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402
from django.db import connection  # noqa: E402
from django.test import Client  # noqa: E402
from django.test.utils import override_settings, setup_test_environment  # noqa: E402

PAGES = {
    "dashboard": "/w/team-a/",
    "jobs (queue)": "/w/team-a/jobs/?tab=queue",
    "jobs (all)": "/w/team-a/jobs/?tab=all",
    "instances": "/w/team-a/instances/",
    "landing": "/",
    "admin console": "/console/",
    "metrics": "/metrics",  # a scraper's, with the bearer token
}
METRICS_TOKEN = "bench-metrics-token"


def fill(jobs: int, instances: int) -> None:
    from apps.compute.actions import check_launch_instance
    from apps.jobs.actions import check_submit_job
    from apps.jobs.models import Job
    from apps.scheduling.adapter import run_cycle
    from apps.workspaces.models import GPUQuota
    from tests.personas import make_world

    world = make_world()
    team = world.team_a
    team.max_instances = instances + 10
    team.cpu_cores = 100_000
    team.memory_gb = 1_000_000
    team.save()
    GPUQuota.objects.filter(workspace=team).update(gpus=Decimal(8))
    for i in range(instances):
        check_launch_instance(team, name=f"box-{i}", profile=world.cpu_small, acting_user=world.alice)
    for i in range(jobs):
        user = world.alice if i % 2 else world.bob
        check_submit_job(
            team,
            name=f"job-{i}",
            command="true",
            gpu_type="h100",
            gpus_per_replica=Decimal(1 + i % 2),
            replicas=1 + i % 3,
            acting_user=user,
        )
    finished = Job.objects.filter(workspace=team).order_by("id")[: jobs // 3].values_list("pk", flat=True)
    Job.objects.filter(pk__in=list(finished)).update(state=Job.State.SUCCEEDED, progress=1.0)
    run_cycle()


def measure(client: Client, url: str, runs: int) -> dict[str, float]:
    for _ in range(10):
        client.get(url)
    times = []
    for _ in range(runs):
        began = time.perf_counter()
        response = client.get(url)
        times.append((time.perf_counter() - began) * 1000)
        assert response.status_code == 200, (url, response.status_code)
    times.sort()
    return {
        "p50_ms": round(statistics.median(times), 1),
        "p95_ms": round(times[int(len(times) * 0.95) - 1], 1),
        "max_ms": round(times[-1], 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--instances", type=int, default=100)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if connection.vendor != "postgresql":
        print("Set DATABASE_URL to a PostgreSQL server (a throwaway database is made there).", file=sys.stderr)
        return 2
    setup_test_environment()
    name = connection.creation.create_test_db(verbosity=0, autoclobber=True)
    results: dict[str, dict[str, float]] = {}
    try:
        plain = {
            **settings.STORAGES,
            "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
        }
        with override_settings(
            STORAGES=plain,
            PASSWORD_HASHERS=["django.contrib.auth.hashers.MD5PasswordHasher"],
            PORTAL_METRICS_TOKEN=METRICS_TOKEN,
        ):
            began = time.perf_counter()
            fill(args.jobs, args.instances)
            print(f"filled {name} in {time.perf_counter() - began:.1f} s", flush=True)
            from django.contrib.auth import get_user_model

            users = get_user_model().objects
            for label, url in PAGES.items():
                if url == "/metrics":
                    client = Client(headers={"Authorization": f"Bearer {METRICS_TOKEN}"})
                else:
                    client = Client()
                    client.force_login(users.get(username="admin" if url.startswith("/console") else "alice"))
                results[label] = measure(client, url, args.runs)
                print(
                    f"{label:16} p50 {results[label]['p50_ms']:6.1f} ms   p95 {results[label]['p95_ms']:6.1f} ms",
                    flush=True,
                )
    finally:
        connection.creation.destroy_test_db(name, verbosity=0)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps({"jobs": args.jobs, "instances": args.instances, "runs": args.runs, "pages": results}, indent=2)
        )
    return 1 if max(results[p]["p95_ms"] for p in ("dashboard", "jobs (queue)", "jobs (all)")) > 100 else 0


if __name__ == "__main__":
    sys.exit(main())
