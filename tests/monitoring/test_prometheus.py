"""The shipped Prometheus rules and Grafana dashboard, checked by the real tools, and a real
Prometheus (Debian's) scraping the live portal with its token, evaluating the shipped alerting
rules and delivering what fires to a real Alertmanager, which posts it to a receiver on loopback.

Only the rules' `for:` durations are shortened for the live run (minutes of waiting otherwise);
their expressions, labels and annotations are the shipped ones, and `alerts_test.yml` (run here
by `promtool test rules`) checks them with their real durations."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from datetime import timedelta
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from django.db import transaction
from django.utils import timezone

from apps.jobs.actions import check_submit_job, do_cancel_job
from apps.jobs.models import Job
from apps.monitoring.metrics import registry
from tests.personas import World
from tests.proxy import ROOT, free_port

DEPLOY = ROOT / "deploy" / "prometheus"
DASHBOARD = ROOT / "deploy" / "grafana" / "gpuportal.json"
TOKEN = "scraper-token-for-the-live-test"


def _tool(name: str) -> str:
    path = shutil.which(name)
    assert path, f"{name} is missing: deploy/test.sh installs Debian's prometheus and prometheus-alertmanager"
    return path


def test_the_rules_pass_promtool_and_their_unit_tests() -> None:
    for args in (["check", "rules", "alerts.yml"], ["test", "rules", "alerts_test.yml"]):
        done = subprocess.run([_tool("promtool"), *args], cwd=DEPLOY, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr


def test_the_example_configurations_pass_their_checks(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text(TOKEN)
    config = (DEPLOY / "prometheus.yml").read_text().replace("/etc/prometheus/gpuportal-metrics-token", str(token))
    (tmp_path / "prometheus.yml").write_text(config)
    shutil.copy(DEPLOY / "alerts.yml", tmp_path / "alerts.yml")
    checks = (
        [_tool("promtool"), "check", "config", str(tmp_path / "prometheus.yml")],
        [_tool("amtool"), "check-config", str(DEPLOY / "alertmanager.yml")],
    )
    for check in checks:
        done = subprocess.run(check, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr


def test_the_embedded_example_passes_promtool_with_the_token_file_the_portal_writes(tmp_path: Path) -> None:
    config = (DEPLOY / "prometheus-embedded.yml").read_text()
    [token_file] = re.findall(r"(?m)^\s+credentials_file: (\S+)$", config)
    # Read from the file's own directory: the default data directory's token (portal/settings.py).
    assert (DEPLOY / token_file).resolve() == (ROOT / "var" / "metrics_token").resolve()
    assert "scheme: http\n" in config and '"127.0.0.1:8000"' in config
    # The same layout as a clone's, in which the portal has started once (and written its token).
    copy = tmp_path / "deploy" / "prometheus"
    copy.mkdir(parents=True)
    for name in ("prometheus-embedded.yml", "alerts.yml"):
        shutil.copy(DEPLOY / name, copy / name)
    check = [_tool("promtool"), "check", "config", str(copy / "prometheus-embedded.yml")]
    refused = subprocess.run(check, capture_output=True, text=True, timeout=60)
    assert refused.returncode != 0 and "metrics_token" in refused.stdout + refused.stderr
    (tmp_path / "var").mkdir()
    (tmp_path / "var" / "metrics_token").write_text(TOKEN)
    done = subprocess.run(check, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_dashboard_asks_for_its_data_source_on_import() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    [source] = dashboard["__inputs"]
    assert source | {"name": "DS_PROMETHEUS", "type": "datasource", "pluginId": "prometheus"} == source
    wanted = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
    users = [*dashboard["panels"], *(t for p in dashboard["panels"] for t in p["targets"])]
    users += [v for v in dashboard["templating"]["list"] if v["type"] == "query"]
    assert users and all(user["datasource"] == wanted for user in users)
    assert "${datasource}" not in DASHBOARD.read_text()


def test_the_dashboard_asks_only_for_metrics_the_portal_serves_in_valid_promql(world: World, tmp_path: Path) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    served = {family.name for family in registry().collect()}
    served |= {f"{name}_total" for name in served} | {f"{name}_bucket" for name in served}
    exprs = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    assert exprs and dashboard["uid"] and dashboard["schemaVersion"] >= 36
    for expr in exprs:
        for name in re.findall(r"\b(gpuportal_[a-z_]+)", expr):
            assert name in served, (name, expr)
    # Each expression, as a recording rule, through Prometheus' own parser (Grafana's variables
    # replaced by what they stand for).
    rules = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [
                    {
                        "record": f"dashboard:panel_{i}",
                        "expr": e.replace("$__rate_interval", "1m").replace("$workspace", ".*"),
                    }
                    for i, e in enumerate(exprs)
                ],
            }
        ]
    }
    (tmp_path / "dashboard-rules.json").write_text(json.dumps(rules))
    done = subprocess.run(
        [_tool("promtool"), "check", "rules", str(tmp_path / "dashboard-rules.json")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr


class Receiver:
    """A webhook receiver on loopback: what Alertmanager posts, in order."""

    def __init__(self) -> None:
        received: list[dict[str, Any]] = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (the standard library's name)
                length = int(self.headers.get("Content-Length") or 0)
                received.append(json.loads(self.rfile.read(length)))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.received = received
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/alerts"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def alerts(self, name: str, status: str) -> list[dict[str, Any]]:
        return [
            alert
            for message in self.received
            for alert in message["alerts"]
            if alert["labels"]["alertname"] == name and alert["status"] == status
        ]


def _started(argv: list[str], log: Path, ready_url: str) -> subprocess.Popen[bytes]:
    process = subprocess.Popen(argv, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert process.poll() is None, log.read_text()[-2000:]
        try:
            with urllib.request.urlopen(ready_url, timeout=2):
                return process
        except OSError:
            time.sleep(0.2)
    process.kill()
    raise AssertionError(f"{argv[0]} did not come up: {log.read_text()[-2000:]}")


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


def _wait_for(what: str, check: Any, timeout_s: float = 90) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.5)
    raise AssertionError(f"no {what} within {timeout_s:.0f} s")


@pytest.fixture
def stack(live_server: Any, settings: Any, tmp_path: Path) -> Iterator[tuple[str, Receiver]]:
    """Alertmanager posting to a receiver, and Prometheus scraping the live portal (and once
    more with a wrong token) every second, with the shipped rules."""
    settings.PORTAL_METRICS_TOKEN = TOKEN
    receiver = Receiver()
    am_port, prom_port = free_port(), free_port()
    (tmp_path / "alertmanager.yml").write_text(
        json.dumps(
            {
                "route": {"receiver": "test", "group_by": ["alertname", "workspace"], "group_wait": "1s",
                          "group_interval": "1s", "repeat_interval": "1h"},
                "receivers": [{"name": "test", "webhook_configs": [{"url": receiver.url, "send_resolved": True}]}],
            }
        )
    )  # fmt: skip
    rules = re.sub(r"(?m)^(\s+)for: \S+$", r"\1for: 0s", (DEPLOY / "alerts.yml").read_text())
    (tmp_path / "alerts.yml").write_text(rules)
    target = live_server.url.removeprefix("http://")
    scrape = {"metrics_path": "/metrics", "static_configs": [{"targets": [target]}]}
    (tmp_path / "prometheus.yml").write_text(
        json.dumps(
            {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "rule_files": [str(tmp_path / "alerts.yml")],
                "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{am_port}"]}]}]},
                "scrape_configs": [
                    {"job_name": "gpuportal", **scrape, "authorization": {"credentials": TOKEN}},
                    {"job_name": "wrong-token", **scrape, "authorization": {"credentials": "guess"}},
                ],
            }
        )
    )
    alertmanager = _started(
        [
            _tool("prometheus-alertmanager"),
            f"--config.file={tmp_path / 'alertmanager.yml'}",
            f"--storage.path={tmp_path / 'am-data'}",
            f"--web.listen-address=127.0.0.1:{am_port}",
            "--cluster.listen-address=",
        ],
        tmp_path / "alertmanager.log",
        f"http://127.0.0.1:{am_port}/-/ready",
    )
    try:
        prometheus = _started(
            [
                _tool("prometheus"),
                f"--config.file={tmp_path / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp_path / 'prom-data'}",
                f"--web.listen-address=127.0.0.1:{prom_port}",
            ],
            tmp_path / "prometheus.log",
            f"http://127.0.0.1:{prom_port}/-/ready",
        )
        try:
            yield f"http://127.0.0.1:{prom_port}", receiver
        finally:
            prometheus.terminate()
            prometheus.wait(timeout=30)
    finally:
        alertmanager.terminate()
        alertmanager.wait(timeout=30)
        receiver.server.shutdown()


def test_prometheus_scrapes_the_portal_and_its_alert_reaches_alertmanager(
    tx_world: World, stack: tuple[str, Receiver]
) -> None:
    prometheus, receiver = stack
    world = tx_world
    # A job that waits: submitted two hours ago, not to be admitted before tomorrow (a requeued
    # gang's backoff), so in the same transaction as its submission.
    with transaction.atomic():
        job = check_submit_job(
            world.team_a, name="stuck", command="true", gpu_type="h100", gpus_per_replica=Decimal(1),
            acting_user=world.bob,
        )  # fmt: skip
        Job.objects.filter(pk=job.pk).update(
            created_at=timezone.now() - timedelta(hours=2), eligible_at=timezone.now() + timedelta(days=1)
        )

    def targets() -> dict[str, dict[str, Any]] | None:
        active = _get(f"{prometheus}/api/v1/targets")["data"]["activeTargets"]
        health = {t["labels"]["job"]: t for t in active}
        return health if all(t["health"] != "unknown" for t in health.values()) and len(health) == 2 else None

    health = _wait_for("scrape of both targets", targets)
    assert health["gpuportal"]["health"] == "up", health["gpuportal"]
    assert health["wrong-token"]["health"] == "down" and "401" in health["wrong-token"]["lastError"]

    # The queue's other label sets are there too, at 0: the one that waits is the one above 0.
    query = f"{prometheus}/api/v1/query?query=gpuportal_queue_oldest_wait_seconds%3E0"
    [series] = _wait_for("the queue in Prometheus", lambda: _get(query)["data"]["result"])
    assert series["metric"]["workspace"] == "team-a" and float(series["value"][1]) > 7000

    [firing] = _wait_for("the alert at the receiver", lambda: receiver.alerts("GpuPortalQueueWaitHigh", "firing"))
    assert firing["labels"] | {"workspace": "team-a", "gpu_type": "h100", "severity": "warning"} == firing["labels"]
    assert firing["annotations"]["summary"] == "Work has waited over an hour in team-a (h100)"

    # The job cancelled, the queue is empty: the alert resolves, and the receiver hears it.
    do_cancel_job(Job.objects.get(pk=job.pk), acting_user=world.bob)
    _wait_for("the alert's resolution", lambda: receiver.alerts("GpuPortalQueueWaitHigh", "resolved"), timeout_s=120)
    # ...and the job's end is in what it scrapes.
    cancelled = f'{prometheus}/api/v1/query?query=gpuportal_workloads{{kind="job",state="CANCELLED"}}'
    _wait_for("the cancelled job", lambda: [r for r in _get(cancelled)["data"]["result"] if r["value"][1] == "1"])
