"""The embedded default under a burst: 500 concurrent requests (half of them job submissions, each
sending a message through the filesystem broker) get 500 answers, none an error, and no process
of the portal dies."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from tests.test_embedded import EmbeddedPortal


@pytest.mark.slow
def test_a_burst_of_500_requests_gets_500_answers_and_crashes_nothing(tmp_path: Path) -> None:
    portal = EmbeddedPortal(tmp_path / "portal-data")
    try:
        url = portal.wait_ready()
        headers = portal.admin_headers(url)

        def request(n: int) -> int:
            if n % 2:
                return requests.get(f"{url}/api/v1/jobs/", headers=headers, timeout=120).status_code
            body = {"workspace": "admin", "name": f"burst-{n}", "command": "true"}
            return requests.post(f"{url}/api/v1/jobs/", json=body, headers=headers, timeout=120).status_code

        with ThreadPoolExecutor(max_workers=100) as pool:
            statuses = list(pool.map(request, range(500)))
        time.sleep(2)  # time for the worker to take the burst's messages

        assert sorted(set(statuses)) == [200, 201], [s for s in statuses if s not in (200, 201)][:10]
        assert statuses.count(201) == 250
        assert not any("exited with status" in line for line in portal.output), "".join(portal.output)
        jobs = requests.get(f"{url}/api/v1/jobs/", headers=headers, params={"page_size": 500}, timeout=30).json()
        assert jobs["count"] == 250
    finally:
        assert portal.stop() == 0
