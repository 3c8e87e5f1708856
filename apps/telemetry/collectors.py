"""Where GPU measurements come from, by backend, behind one interface: `readings()` gives each
device's utilisation, memory, temperature and power, named by node and index (or UUID).

- **This machine** (the local backend): NVML, through `nvidia-ml-py`, in the scheduler loop's
  process, which runs on the machine the local backend starts workloads on.
- **Kubernetes**: the DCGM exporter's Prometheus metrics, scraped from the URL in the cluster's
  connection (`dcgm_url`, for example `http://dcgm-exporter.gpu-operator:9400/metrics`).
- **Slurm**: its own accounting of the portal's running jobs (`sstat`), where the cluster records
  GPU usage: `gres/gpuutil` and `gres/gpumem` in `AccountingStorageTRES`, gathered by slurmd's
  NVML GPU plugin (`AutoDetect=nvml`). Slurm measures a job step's processes, not a device: their
  utilisation summed over the GPUs they use, and the memory they hold. Each of the job's devices
  is given the job's mean. A step without those figures (the cluster does not gather them) gives
  no reading, never a zero.

Where there is no source (no NVIDIA driver, a declared inventory, a cluster without `dcgm_url`),
`collector_for()` says so with None and the pages say "no telemetry"; nothing is made up.
"""

from __future__ import annotations

import logging
import re
import subprocess
import urllib.request
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from prometheus_client.parser import text_string_to_metric_families

from apps.inventory.models import GPU, Allocation, Cluster

logger = logging.getLogger(__name__)

SCRAPE_TIMEOUT_S = 5.0


class NoTelemetry(Exception):
    """The source could not be read this time (no driver, the exporter down): no samples."""


@dataclass(frozen=True)
class Reading:
    node: str  # the node's name as the inventory has it ("" on the local cluster: its one node)
    index: int
    uuid: str
    utilisation: float  # percent
    memory_used_mb: int
    memory_total_mb: int
    temperature_c: float | None = None
    power_w: float | None = None


class Collector(Protocol):
    def readings(self) -> list[Reading]: ...


class NvmlCollector:
    """Every GPU NVML sees on this machine."""

    def readings(self) -> list[Reading]:
        try:
            import pynvml
        except ImportError as exc:
            raise NoTelemetry("nvidia-ml-py is not installed") from exc
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise NoTelemetry(f"NVML: {exc}") from exc
        try:
            found = []
            for index in range(pynvml.nvmlDeviceGetCount()):
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                uuid = pynvml.nvmlDeviceGetUUID(handle)
                memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
                found.append(
                    Reading(
                        node="",
                        index=index,
                        uuid=uuid.decode() if isinstance(uuid, bytes) else uuid,
                        utilisation=float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu),
                        memory_used_mb=int(memory.used // (1024 * 1024)),
                        memory_total_mb=int(memory.total // (1024 * 1024)),
                        temperature_c=_optional(pynvml.nvmlDeviceGetTemperature, handle, pynvml.NVML_TEMPERATURE_GPU),
                        power_w=_milli(_optional(pynvml.nvmlDeviceGetPowerUsage, handle)),
                    )
                )
            return found
        except pynvml.NVMLError as exc:
            raise NoTelemetry(f"NVML: {exc}") from exc
        finally:
            pynvml.nvmlShutdown()


def _optional(read: Callable[..., Any], *args: Any) -> float | None:
    """A measurement a device may not support (power on some boards): None rather than a failure."""
    try:
        return float(read(*args))
    except Exception:
        return None


def _milli(value: float | None) -> float | None:
    return value / 1000 if value is not None else None


# The DCGM exporter's field names (its default counters), and what each is here.
DCGM_FIELDS = {
    "DCGM_FI_DEV_GPU_UTIL": "utilisation",
    "DCGM_FI_DEV_FB_USED": "memory_used_mb",
    "DCGM_FI_DEV_FB_FREE": "memory_free_mb",
    "DCGM_FI_DEV_GPU_TEMP": "temperature_c",
    "DCGM_FI_DEV_POWER_USAGE": "power_w",
}


class DcgmCollector:
    """The GPUs a DCGM exporter reports (one exporter URL for the cluster: a Service in front of
    the exporter's DaemonSet, or a federating Prometheus' `/federate`)."""

    def __init__(self, url: str) -> None:
        self.url = url

    def readings(self) -> list[Reading]:
        try:
            with urllib.request.urlopen(self.url, timeout=SCRAPE_TIMEOUT_S) as response:
                text = response.read().decode("utf-8", "replace")
        except OSError as exc:
            raise NoTelemetry(f"the DCGM exporter at {self.url}: {exc}") from exc
        return parse_dcgm(text)


def parse_dcgm(text: str) -> list[Reading]:
    """Readings from the DCGM exporter's text format: one per (Hostname, gpu) with a utilisation."""
    values: dict[tuple[str, int], dict[str, float | str]] = {}
    try:
        families = list(text_string_to_metric_families(text))
    except ValueError as exc:
        raise NoTelemetry(f"not the Prometheus text format: {exc}") from exc
    for family in families:
        for sample in family.samples:
            field = DCGM_FIELDS.get(sample.name)
            gpu = sample.labels.get("gpu", "")
            if field is None or not gpu.isdigit():
                continue
            device = values.setdefault((sample.labels.get("Hostname", ""), int(gpu)), {})
            device[field] = sample.value
            device["uuid"] = sample.labels.get("UUID", "")
    readings = []
    for (node, index), device in sorted(values.items()):
        if "utilisation" not in device:
            continue
        used = int(float(device.get("memory_used_mb", 0)))
        temperature, power = device.get("temperature_c"), device.get("power_w")
        readings.append(
            Reading(
                node=node,
                index=index,
                uuid=str(device["uuid"]),
                utilisation=float(device["utilisation"]),
                memory_used_mb=used,
                memory_total_mb=used + int(float(device.get("memory_free_mb", 0))),
                temperature_c=float(temperature) if temperature is not None else None,
                power_w=float(power) if power is not None else None,
            )
        )
    return readings


SSTAT_TIMEOUT_S = 20.0
_SIZE = re.compile(r"^([0-9]+(?:\.[0-9]+)?)([KMGTP]?)$")
_SCALE = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4, "P": 1024**5}


@dataclass(frozen=True)
class StepUsage:
    """What Slurm gathered of one job's running steps, added up: GPU utilisation in percent summed
    over the devices its processes use, and GPU memory they hold, in bytes."""

    utilisation: float
    memory_bytes: int


def parse_sstat(text: str) -> dict[str, StepUsage]:
    """Per Slurm job id, the usage of its running steps from `sstat -a -n -P
    --format=JobID,TRESUsageInTot` (lines `<job>.<step>|cpu=...,gres/gpumem=2048M,gres/gpuutil=73`).
    Steps without `gres/gpuutil` (not gathered) are left out, so a job none of whose steps has it
    is absent."""
    util: dict[str, float] = defaultdict(float)
    memory: dict[str, int] = defaultdict(int)
    for line in text.splitlines():
        step, _, tres = line.strip().partition("|")
        job = step.split(".", 1)[0]
        if not job.isdigit():
            continue
        values = dict(item.partition("=")[::2] for item in tres.split(",") if "=" in item)
        gpuutil = _size(values.get("gres/gpuutil", ""))
        if gpuutil is None:
            continue
        util[job] += gpuutil
        memory[job] += int(_size(values.get("gres/gpumem", "")) or 0)
    return {job: StepUsage(util[job], memory[job]) for job in util}


def _size(text: str) -> float | None:
    """A TRES figure as a number: `73`, `2048M` (binary units), or None if there is none."""
    match = _SIZE.match(text.strip())
    return float(match[1]) * _SCALE[match[2]] if match else None


class SlurmCollector:
    """The devices the portal's running Slurm jobs and instances hold, as Slurm's accounting
    gathered them (`sstat`, on the machine that submits to the cluster)."""

    def __init__(self, cluster: Cluster, sstat_path: str = "sstat") -> None:
        self.cluster = cluster
        self.sstat_path = sstat_path

    def readings(self) -> list[Reading]:
        held: dict[str, list[GPU]] = defaultdict(list)  # Slurm job id -> the devices its workload holds
        allocations = (
            Allocation.objects.filter(gpu__node__pool__cluster=self.cluster)
            .select_related("gpu__node", "workload")
            .order_by("gpu__node__name", "gpu__index", "id")
        )
        for allocation in allocations:
            slurm_id = str((allocation.workload.backend_state or {}).get("job_id", ""))
            if slurm_id.isdigit() and allocation.gpu not in held[slurm_id]:
                held[slurm_id].append(allocation.gpu)
        if not held:
            return []
        argv = [self.sstat_path, "-a", "-n", "-P", "--format=JobID,TRESUsageInTot", "-j", ",".join(sorted(held))]
        try:
            # A job with no step running is named on stderr, and sstat still answers for the others and exits 0.
            proc = subprocess.run(
                argv, capture_output=True, text=True, timeout=SSTAT_TIMEOUT_S, stdin=subprocess.DEVNULL, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise NoTelemetry(f"sstat: {exc}") from exc
        if proc.returncode != 0:
            raise NoTelemetry(f"sstat: {proc.stderr.strip() or f'exit code {proc.returncode}'}")
        readings = []
        for slurm_id, usage in parse_sstat(proc.stdout).items():
            gpus = held.get(slurm_id, [])
            for gpu in gpus:
                readings.append(
                    Reading(
                        node=gpu.node.name,
                        index=gpu.index,
                        uuid=gpu.uuid,
                        utilisation=min(100.0, usage.utilisation / len(gpus)),
                        memory_used_mb=int(usage.memory_bytes / len(gpus) // (1024 * 1024)),
                        memory_total_mb=gpu.memory_mb,
                    )
                )
        return readings


def collector_for(cluster: Cluster) -> Collector | None:
    """The cluster's source of measurements, or None where it has none."""
    if cluster.kind == Cluster.Kind.LOCAL:
        hardware = GPU.objects.filter(node__pool__cluster=cluster, declared=False).exists()
        return NvmlCollector() if hardware else None
    if cluster.kind == Cluster.Kind.KUBERNETES:
        url = str((cluster.connection or {}).get("dcgm_url") or "")
        return DcgmCollector(url) if url.startswith(("http://", "https://")) else None
    if cluster.kind == Cluster.Kind.SLURM:
        return SlurmCollector(cluster)
    return None
