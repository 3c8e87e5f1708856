"""GPU telemetry: the sources (NVML on this machine, a DCGM exporter over HTTP), what is stored and
folded, and where it shows (a workload's page, the console's inventory, /metrics); "no telemetry"
where there is no source, never zeros."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from datetime import timedelta
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from apps.compute.models import Instance, Notebook
from apps.inventory.models import GPU, Allocation, Cluster, Node, NodePool
from apps.jobs.actions import check_submit_job
from apps.telemetry.collectors import (
    DcgmCollector,
    NoTelemetry,
    NvmlCollector,
    SlurmCollector,
    StepUsage,
    collector_for,
    parse_sstat,
)
from apps.telemetry.models import GpuSample
from apps.telemetry.record import fold, latest, sample
from tests.personas import World

# What a DCGM exporter (dcgm-exporter's default counters) serves for two GPUs of one node.
DCGM_TEXT = """\
# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).
# TYPE DCGM_FI_DEV_GPU_UTIL gauge
DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-aaaa",device="nvidia0",modelName="NVIDIA H100",Hostname="gpu-node-1"} 87
DCGM_FI_DEV_GPU_UTIL{gpu="1",UUID="GPU-bbbb",device="nvidia1",modelName="NVIDIA H100",Hostname="gpu-node-1"} 3
# HELP DCGM_FI_DEV_FB_USED Framebuffer memory used (in MiB).
# TYPE DCGM_FI_DEV_FB_USED gauge
DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-aaaa",device="nvidia0",Hostname="gpu-node-1"} 61440
DCGM_FI_DEV_FB_USED{gpu="1",UUID="GPU-bbbb",device="nvidia1",Hostname="gpu-node-1"} 512
# HELP DCGM_FI_DEV_FB_FREE Framebuffer memory free (in MiB).
# TYPE DCGM_FI_DEV_FB_FREE gauge
DCGM_FI_DEV_FB_FREE{gpu="0",UUID="GPU-aaaa",device="nvidia0",Hostname="gpu-node-1"} 20480
DCGM_FI_DEV_FB_FREE{gpu="1",UUID="GPU-bbbb",device="nvidia1",Hostname="gpu-node-1"} 81408
# HELP DCGM_FI_DEV_GPU_TEMP GPU temperature (in C).
# TYPE DCGM_FI_DEV_GPU_TEMP gauge
DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-aaaa",device="nvidia0",Hostname="gpu-node-1"} 64
DCGM_FI_DEV_GPU_TEMP{gpu="1",UUID="GPU-bbbb",device="nvidia1",Hostname="gpu-node-1"} 31
# HELP DCGM_FI_DEV_POWER_USAGE Power draw (in W).
# TYPE DCGM_FI_DEV_POWER_USAGE gauge
DCGM_FI_DEV_POWER_USAGE{gpu="0",UUID="GPU-aaaa",device="nvidia0",Hostname="gpu-node-1"} 512.25
DCGM_FI_DEV_POWER_USAGE{gpu="1",UUID="GPU-bbbb",device="nvidia1",Hostname="gpu-node-1"} 71.5
# HELP DCGM_FI_DEV_SM_CLOCK SM frequency (in MHz).
# TYPE DCGM_FI_DEV_SM_CLOCK gauge
DCGM_FI_DEV_SM_CLOCK{gpu="0",UUID="GPU-aaaa",device="nvidia0",Hostname="gpu-node-1"} 1980
"""


class Exporter:
    """A DCGM exporter's /metrics on loopback: serves `text`, or fails while `down`."""

    def __init__(self) -> None:
        self.text, self.down = DCGM_TEXT, False
        exporter = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (the standard library's name)
                if exporter.down:
                    self.send_response(503)
                    self.end_headers()
                    return
                body = exporter.text.encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/metrics"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def exporter() -> Iterator[Exporter]:
    running = Exporter()
    yield running
    running.server.shutdown()


@pytest.fixture
def gpu_cluster(world: World, exporter: Exporter) -> Cluster:
    """A Kubernetes cluster of one node with two H100, its DCGM exporter at `exporter`."""
    cluster = Cluster.objects.create(name="k8s", kind=Cluster.Kind.KUBERNETES, connection={"dcgm_url": exporter.url})
    node = Node.objects.create(pool=NodePool.objects.create(cluster=cluster, name="gpu"), name="gpu-node-1")
    for index, uuid in enumerate(("GPU-aaaa", "GPU-bbbb")):
        GPU.objects.create(node=node, index=index, uuid=uuid, gpu_type="h100", model="NVIDIA H100", memory_mb=81920)
    return cluster


def test_nvml_reads_this_machines_gpus_or_says_there_is_no_telemetry(world: World) -> None:
    """Without an NVIDIA driver (this machine, CI) NVML refuses, and the local cluster, whose
    inventory is declared, has no source at all; with one, every reading is a device's."""
    has_driver = os.path.exists("/dev/nvidiactl")
    if has_driver:
        readings = NvmlCollector().readings()
        assert readings and all(0 <= r.utilisation <= 100 and r.memory_total_mb > 0 for r in readings)
    else:
        with pytest.raises(NoTelemetry, match="NVML"):
            NvmlCollector().readings()
    local = Cluster.objects.get(name="local")
    assert GPU.objects.filter(node__pool__cluster=local, declared=True).exists()
    assert collector_for(local) is None


def test_the_dcgm_exporter_is_read_over_http_and_stored_with_who_held_each_gpu(
    world: World, gpu_cluster: Cluster, exporter: Exporter
) -> None:
    readings = DcgmCollector(exporter.url).readings()
    assert [(r.node, r.index, r.uuid, r.utilisation) for r in readings] == [
        ("gpu-node-1", 0, "GPU-aaaa", 87.0),
        ("gpu-node-1", 1, "GPU-bbbb", 3.0),
    ]
    assert (readings[0].memory_used_mb, readings[0].memory_total_mb) == (61440, 81920)
    assert (readings[0].temperature_c, readings[0].power_w) == (64.0, 512.25)

    job = check_submit_job(world.team_a, name="train", command="true", acting_user=world.bob)
    gpu0 = GPU.objects.get(uuid="GPU-aaaa")
    Allocation.objects.create(gpu=gpu0, fraction=Decimal(1), workload=job)
    assert sample() == 2  # the k8s cluster's two devices; the local one has no source
    stored = {row.gpu.uuid: row for row in GpuSample.objects.select_related("gpu")}
    assert stored["GPU-aaaa"].workload_id == job.pk and stored["GPU-aaaa"].workspace_id == world.team_a.pk
    assert stored["GPU-bbbb"].workload_id is None and stored["GPU-bbbb"].utilisation == 3.0
    assert set(latest(GPU.objects.filter(node__pool__cluster=gpu_cluster))) == {gpu0.pk, stored["GPU-bbbb"].gpu_id}

    # The exporter down: nothing stored, nothing raised; the pages then say "no telemetry" again
    # once the last samples grow old.
    exporter.down = True
    assert sample() == 0
    assert latest(GPU.objects.all(), now=timezone.now() + timedelta(minutes=5)) == {}


# What `sstat -a -n -P --format=JobID,TRESUsageInTot` prints on a cluster whose slurmd gathers GPU
# usage (gres.conf AutoDetect=nvml): job 41 has two steps running, job 42 one, and job 43's step
# has no GPU figures (a cluster that does not gather them prints none, as deploy/slurm.sh's does).
SSTAT_TEXT = """\
41.batch|cpu=00:00:01,energy=0,fs/disk=2048,gres/gpumem=0,gres/gpuutil=0,mem=10292K,pages=0,vmem=219236K
41.0|cpu=00:10:00,energy=0,fs/disk=6977,gres/gpumem=3G,gres/gpuutil=150,mem=1652K,pages=0,vmem=2920K
42.0|cpu=00:01:00,energy=0,gres/gpumem=512M,gres/gpuutil=7,mem=1652K
43.batch|cpu=00:00:00,energy=0,fs/disk=28900,mem=10292K,pages=0,vmem=219236K
"""


def test_sstats_gpu_figures_are_added_up_per_job_and_a_step_without_them_gives_none() -> None:
    assert parse_sstat(SSTAT_TEXT) == {"41": StepUsage(150.0, 3 * 1024**3), "42": StepUsage(7.0, 512 * 1024**2)}
    assert parse_sstat("") == parse_sstat("sstat: error: No steps running for job 9\n") == {}
    assert parse_sstat("44.0|gres/gpuutil=12,gres/gpumem=oops") == {"44": StepUsage(12.0, 0)}


def test_a_slurm_clusters_readings_give_each_device_its_jobs_mean(world: World, tmp_path: Any) -> None:
    """The mapping from Slurm's per-job figures to the devices each job holds. `sstat` here is a
    stand-in printing a GPU-gathering cluster's answer (this machine has no GPU for slurmd to
    measure); tests/slurm/test_telemetry.py reads the real Slurm's."""
    cluster = Cluster.objects.create(name="hpc", kind=Cluster.Kind.SLURM, connection={"partition": "gpu"})
    pool = NodePool.objects.create(cluster=cluster, name="gpu")
    gpus = {
        (node, index): GPU.objects.create(
            node=Node.objects.get_or_create(pool=pool, name=node)[0], index=index, gpu_type="h100", memory_mb=81920
        )
        for node in ("node1", "node2")
        for index in (0, 1)
    }
    gang = check_submit_job(world.team_a, name="gang", command="true", acting_user=world.bob)
    single = check_submit_job(world.team_b, name="one", command="true", acting_user=world.charlie)
    quiet = check_submit_job(world.team_a, name="quiet", command="true", acting_user=world.bob)
    for job, slurm_id, places in ((gang, 41, [("node1", 0), ("node2", 0)]), (single, 42, [("node1", 1)]),
                                  (quiet, 43, [("node2", 1)])):  # fmt: skip
        job.backend_state = {"job_id": str(slurm_id)}
        job.save(update_fields=["backend_state"])
        for replica, place in enumerate(places):
            Allocation.objects.create(gpu=gpus[place], fraction=Decimal(1), workload=job, replica=replica)
    asked = tmp_path / "asked"
    stand_in = tmp_path / "sstat"
    stand_in.write_text(f"#!/bin/sh\necho \"$@\" > {asked}\ncat <<'EOF'\n{SSTAT_TEXT}EOF\n")
    stand_in.chmod(0o755)

    readings = SlurmCollector(cluster, sstat_path=str(stand_in)).readings()

    assert asked.read_text().split() == ["-a", "-n", "-P", "--format=JobID,TRESUsageInTot", "-j", "41,42,43"]
    assert sorted((r.node, r.index, r.utilisation, r.memory_used_mb, r.memory_total_mb) for r in readings) == [
        ("node1", 0, 75.0, 1536, 81920),
        ("node1", 1, 7.0, 512, 81920),
        ("node2", 0, 75.0, 1536, 81920),
    ]  # job 43 gathered nothing: its device has no reading, not a zero
    assert isinstance(collector_for(cluster), SlurmCollector)
    failing = tmp_path / "failing"
    failing.write_text("#!/bin/sh\necho 'sstat: error: slurmctld down' >&2\nexit 1\n")
    failing.chmod(0o755)
    with pytest.raises(NoTelemetry, match="slurmctld down"):
        SlurmCollector(cluster, sstat_path=str(failing)).readings()


def test_samples_are_folded_into_minutes_then_hours_then_dropped(world: World, gpu_cluster: Cluster) -> None:
    gpu = GPU.objects.get(uuid="GPU-aaaa")
    # Half past the hour: the two old minutes below (40 days back) fall in one hour whenever it runs.
    now = timezone.now().replace(minute=30, second=30, microsecond=0)
    two_days = now - timedelta(days=2)
    minute = two_days.replace(second=0)

    def raw(at: Any, utilisation: float) -> GpuSample:
        return GpuSample(gpu=gpu, at=at, resolution_s=0, utilisation=utilisation, memory_used_mb=100,
                         memory_total_mb=81920)  # fmt: skip

    GpuSample.objects.bulk_create(
        [raw(minute + timedelta(seconds=10 * i), 10.0 * i) for i in range(6)]  # one minute: 0..50, mean 25
        + [raw(now - timedelta(hours=1), 99.0)]  # within the day: kept as measured
        + [
            GpuSample(
                gpu=gpu,
                at=now - timedelta(days=40, minutes=m),
                resolution_s=60,
                utilisation=40.0 + m,
                memory_used_mb=1,
                memory_total_mb=1,
            )
            for m in range(2)
        ]  # fmt: skip
        + [
            GpuSample(
                gpu=gpu,
                at=now - timedelta(days=400),
                resolution_s=3600,
                utilisation=1.0,
                memory_used_mb=1,
                memory_total_mb=1,
            )
        ]  # fmt: skip
    )
    fold(now)
    minutes = GpuSample.objects.filter(resolution_s=60)
    [folded] = minutes.filter(at=minute)
    assert folded.utilisation == pytest.approx(25.0) and folded.memory_used_mb == 100
    assert GpuSample.objects.filter(resolution_s=0).count() == 1  # the recent one
    hours = GpuSample.objects.filter(resolution_s=3600)
    assert hours.count() == 1 and hours.get().utilisation == pytest.approx(40.5)  # the two old minutes, one hour
    assert not GpuSample.objects.filter(at__lt=now - timedelta(days=365)).exists()
    fold(now)  # again: nothing more to do
    assert GpuSample.objects.count() == 3


def _recent_samples(gpu: GPU, count: int, utilisation: float, **holder: Any) -> None:
    """`count` samples of `gpu` 10 s apart up to now, held by `holder` (workload=, workspace=)."""
    now = timezone.now()
    GpuSample.objects.bulk_create(
        GpuSample(gpu=gpu, at=now - timedelta(seconds=10 * i), resolution_s=0, utilisation=utilisation,
                  memory_used_mb=1, memory_total_mb=2, **holder)
        for i in range(count)
    )  # fmt: skip


def test_a_jobs_page_charts_its_gpus_and_says_no_telemetry_without_samples(world: World, gpu_cluster: Cluster) -> None:
    job = check_submit_job(
        world.team_a, name="train", command="true", gpu_type="h100", gpus_per_replica=Decimal(1), acting_user=world.bob
    )
    bob = Client()
    bob.force_login(world.bob)
    page = bob.get(f"/w/team-a/jobs/{job.pk}/").content.decode()
    assert "No telemetry: the GPUs it holds report no measurements here" in page
    empty = bob.get(f"/w/team-a/jobs/{job.pk}/gpu.json").json()
    assert empty["telemetry"] is False and empty["series"] == {}

    _recent_samples(GPU.objects.get(uuid="GPU-aaaa"), 30, 80.0, workload=job, workspace=world.team_a)
    page = bob.get(f"/w/team-a/jobs/{job.pk}/").content.decode()
    assert f'data-chart-url="/w/team-a/jobs/{job.pk}/gpu.json?window=1h"' in page and "chart.umd" in page
    chart = bob.get(f"/w/team-a/jobs/{job.pk}/gpu.json").json()
    assert chart["telemetry"] is True and chart["y_max"] == 100
    [values] = chart["series"].values()
    assert len(values) == len(chart["labels"]) == 120
    assert {v for v in values if v is not None} == {80.0}
    # Another tenant's: not found.
    charlie = Client()
    charlie.force_login(world.charlie)
    assert charlie.get(f"/w/team-a/jobs/{job.pk}/gpu.json").status_code == 404


def test_a_notebooks_page_charts_its_instances_gpus_to_those_who_may_see_it(world: World, gpu_cluster: Cluster) -> None:
    instance = Instance.objects.create(
        workspace=world.team_a, name="box", profile=world.gpu_1, gpu_type="h100", gpus_per_replica=Decimal(1)
    )
    notebook = Notebook.objects.create(workspace=world.team_a, instance=instance, name="nb", profile=world.minimal)
    bob = Client()
    bob.force_login(world.bob)
    page = bob.get(f"/w/team-a/notebooks/{notebook.pk}/").content.decode()
    assert "No telemetry: the GPUs it holds report no measurements here" in page

    _recent_samples(GPU.objects.get(uuid="GPU-bbbb"), 6, 40.0, workload=instance, workspace=world.team_a)
    page = bob.get(f"/w/team-a/notebooks/{notebook.pk}/").content.decode()
    assert f'data-chart-url="/w/team-a/notebooks/{notebook.pk}/gpu.json?window=1h"' in page
    chart = bob.get(f"/w/team-a/notebooks/{notebook.pk}/gpu.json").json()
    assert chart["telemetry"] is True
    assert {v for values in chart["series"].values() for v in values if v is not None} == {40.0}
    # Another tenant's notebook, or one named under the tenant's own workspace: not found.
    charlie = Client()
    charlie.force_login(world.charlie)
    assert charlie.get(f"/w/team-a/notebooks/{notebook.pk}/gpu.json").status_code == 404
    assert charlie.get(f"/w/team-b/notebooks/{notebook.pk}/gpu.json").status_code == 404


def test_the_inventory_and_the_metrics_show_what_is_measured_and_nothing_where_nothing_is(
    world: World, gpu_cluster: Cluster, settings: Any
) -> None:
    sample()
    admin = Client()
    admin.force_login(world.admin)
    page = admin.get("/console/inventory/").content.decode()
    assert "87 % busy, 61440 / 81920 MB, 64 °C, 512 W" in page
    assert "no telemetry" in page  # the local cluster's declared GPUs
    settings.PORTAL_METRICS_TOKEN = "t" * 20
    metrics = Client().get("/metrics", headers={"Authorization": "Bearer " + "t" * 20}).content.decode()
    assert 'gpuportal_gpu_utilisation_ratio{cluster="k8s",gpu_type="h100"} 0.45' in metrics
    assert 'gpuportal_gpus_measured{cluster="k8s",gpu_type="h100"} 2.0' in metrics
    assert 'cluster="local"' not in metrics.split("gpuportal_gpu_utilisation_ratio")[-1].split("# HELP")[0]


def test_the_dashboard_chart_puts_what_was_measured_busy_beside_what_was_held(
    world: World, gpu_cluster: Cluster
) -> None:
    alice = Client()
    alice.force_login(world.alice)
    assert alice.get("/w/team-a/usage.json?window=1h").json()["measured"] == {}  # no telemetry: nothing, not 0
    now = timezone.now()
    for uuid, utilisation in (("GPU-aaaa", 80.0), ("GPU-bbbb", 40.0)):
        GpuSample.objects.create(gpu=GPU.objects.get(uuid=uuid), at=now - timedelta(seconds=5), resolution_s=0,
                                 utilisation=utilisation, memory_used_mb=1, memory_total_mb=2,
                                 workspace=world.team_a)  # fmt: skip
    GpuSample.objects.create(gpu=GPU.objects.get(uuid="GPU-aaaa"), at=now - timedelta(seconds=5), resolution_s=0,
                             utilisation=100.0, memory_used_mb=1, memory_total_mb=2,
                             workspace=world.team_b)  # another tenant's: not counted  # fmt: skip
    data = alice.get("/w/team-a/usage.json?window=1h").json()
    [busy] = data["measured"].values()
    assert list(data["measured"]) == ["h100"] and len(busy) == len(data["labels"])
    assert busy[-1] == pytest.approx(1.2) and busy[0] is None  # 0.8 + 0.4 GPUs' worth, now; unmeasured before


def test_a_gpus_console_page_charts_what_it_measured_and_says_when_nothing_does(
    world: World, gpu_cluster: Cluster
) -> None:
    admin = Client()
    admin.force_login(world.admin)
    declared = GPU.objects.get(node__pool__cluster__name="local", index=0)
    page = admin.get(f"/console/inventory/gpus/{declared.pk}/").content.decode()
    assert "No telemetry: nothing measures this GPU now" in page and "data-chart-url" not in page
    assert admin.get(f"/console/inventory/gpus/{declared.pk}/samples.json").json()["telemetry"] is False

    sample()
    measured = GPU.objects.get(uuid="GPU-aaaa")
    page = admin.get(f"/console/inventory/gpus/{measured.pk}/").content.decode()
    assert "87 %" in page and f'data-chart-url="/console/inventory/gpus/{measured.pk}/samples.json?window=24h"' in page
    chart = admin.get(f"/console/inventory/gpus/{measured.pk}/samples.json?window=1h").json()
    [values] = chart["series"].values()
    assert chart["telemetry"] is True and [v for v in values if v is not None] == [87.0]
    assert f'href="/console/inventory/gpus/{measured.pk}/"' in admin.get("/console/inventory/").content.decode()
    member = Client()
    member.force_login(world.alice)
    assert member.get(f"/console/inventory/gpus/{measured.pk}/").status_code == 403
    assert member.get(f"/console/inventory/gpus/{measured.pk}/samples.json").status_code == 403
    assert admin.get("/console/inventory/gpus/987654/").status_code == 404
