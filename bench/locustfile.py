"""What the load benchmark's users do (bench/load.py runs it): submit jobs, list them, look at one,
follow its log. Each user signs in with its own token, from the file LOAD_TOKENS names."""

from __future__ import annotations

import itertools
import json
import os
import random
from pathlib import Path

from locust import HttpUser, between, task

TOKENS = json.loads(Path(os.environ["LOAD_TOKENS"]).read_text())
_next_user = itertools.count()


class Researcher(HttpUser):
    wait_time = between(0.05, 0.2)

    def on_start(self) -> None:
        n = next(_next_user)
        self.client.headers["Authorization"] = f"Token {TOKENS[n % len(TOKENS)]}"
        self.jobs: list[int] = []
        self.serial = itertools.count()
        self.prefix = f"u{n}"

    @task(4)
    def submit(self) -> None:
        body = {"workspace": "load", "name": f"{self.prefix}-{next(self.serial)}", "command": "true",
                "gpu_type": "h100", "gpus_per_replica": "1"}  # fmt: skip
        with self.client.post("/api/v1/jobs/", json=body, name="POST /jobs/", catch_response=True) as answer:
            if answer.status_code == 201:
                self.jobs.append(answer.json()["id"])
            else:
                answer.failure(f"{answer.status_code}: {answer.text[:200]}")

    @task(3)
    def list_jobs(self) -> None:
        self.client.get("/api/v1/jobs/?page_size=50", name="GET /jobs/")

    @task(2)
    def job_detail(self) -> None:
        if self.jobs:
            self.client.get(f"/api/v1/jobs/{random.choice(self.jobs)}/", name="GET /jobs/{id}/")

    @task(1)
    def follow_log(self) -> None:
        if self.jobs:
            self.client.get(f"/api/v1/jobs/{random.choice(self.jobs)}/logs/", name="GET /jobs/{id}/logs/")
