"""Finding the local machine's GPUs: NVML where there is a GPU, the declared inventory elsewhere."""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

from workers.backends.base import GpuInfo

logger = logging.getLogger(__name__)

# Declared GPU types the portal knows by name: model, memory (MiB), architecture.
KNOWN_TYPES: dict[str, tuple[str, int, str]] = {
    "h200": ("NVIDIA H200", 143771, "Hopper"),
    "h100": ("NVIDIA H100 80GB HBM3", 81559, "Hopper"),
    "a100": ("NVIDIA A100-SXM4-80GB", 81920, "Ampere"),
    "a10": ("NVIDIA A10", 23028, "Ampere"),
    "l40s": ("NVIDIA L40S", 46068, "Ada Lovelace"),
    "l4": ("NVIDIA L4", 23034, "Ada Lovelace"),
    "v100": ("Tesla V100-SXM2-32GB", 32768, "Volta"),
    "t4": ("Tesla T4", 15360, "Turing"),
}

# nvmlDeviceGetArchitecture's values.
_ARCHITECTURES = {2: "Kepler", 3: "Maxwell", 4: "Pascal", 5: "Volta", 6: "Turing", 7: "Ampere", 8: "Ada Lovelace",
                  9: "Hopper", 10: "Blackwell"}  # fmt: skip

# COUNTxTYPE, where TYPE is a valid GPU type name (apps.names.GPU_TYPE_RE).
_DECLARED_RE = re.compile(r"^(\d+)x([a-z0-9](?:[-a-z0-9]{0,30}[a-z0-9])?)$")

# Words that name a family, not a model: 'RTX 4090' and 'RTX A6000' are different GPUs.
_FAMILIES = ("rtx", "gtx", "titan")


@dataclass(frozen=True)
class GPUInfo:
    index: int
    gpu_type: str
    model: str
    memory_mb: int
    architecture: str
    uuid: str = ""
    declared: bool = False


def gpu_type_from_model(model: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'h100'; 'Tesla T4' -> 't4'; 'NVIDIA GeForce RTX 4090' -> 'rtx-4090'.
    Kubernetes labels write the words with dashes ('NVIDIA-H100-80GB-HBM3' -> 'h100')."""
    words = re.sub(r"^(nvidia|tesla|geforce|quadro)[\s_-]+", "", model.strip().lower())
    words = re.sub(r"^(nvidia|tesla|geforce|quadro)[\s_-]+", "", words)
    parts = re.split(r"[\s_]+", words) if words else ["gpu"]
    first = "-".join(parts[:2]) if parts[0] in _FAMILIES else parts[0]
    for known in sorted(KNOWN_TYPES, key=len, reverse=True):
        if re.match(rf"{known}(?![a-z0-9])", first):  # 'l40' is not an 'l4'
            return known
    return re.sub(r"[^a-z0-9-]+", "-", first)[:32].strip("-") or "gpu"


def parse_declared(spec: str) -> list[GPUInfo]:
    """Parse PORTAL_DECLARED_GPUS, e.g. '8xh100' or '4xa100,2xt4'."""
    gpus: list[GPUInfo] = []
    for item in filter(None, (part.strip().lower() for part in spec.split(","))):
        match = _DECLARED_RE.match(item)
        if not match:
            raise ValueError(f"PORTAL_DECLARED_GPUS item {item!r}: expected COUNTxTYPE, e.g. 8xh100")
        count, gpu_type = int(match.group(1)), match.group(2)
        model, memory_mb, architecture = KNOWN_TYPES.get(gpu_type, (gpu_type.upper(), 0, ""))
        for _ in range(count):
            gpus.append(GPUInfo(len(gpus), gpu_type, model, memory_mb, architecture, declared=True))
    return gpus


def nvml_gpus() -> list[GPUInfo] | None:
    """The GPUs NVML sees, or None where there is no NVIDIA driver."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        logger.info("NVML not available (%s): using the declared GPU inventory", exc)
        return None
    try:
        gpus = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            model = pynvml.nvmlDeviceGetName(handle)
            model = model.decode() if isinstance(model, bytes) else model
            uuid = pynvml.nvmlDeviceGetUUID(handle)
            uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
            memory_mb = pynvml.nvmlDeviceGetMemoryInfo(handle).total // (1024 * 1024)
            try:
                architecture = _ARCHITECTURES.get(pynvml.nvmlDeviceGetArchitecture(handle), "")
            except pynvml.NVMLError:
                architecture = ""
            gpus.append(GPUInfo(index, gpu_type_from_model(model), model, int(memory_mb), architecture, uuid))
        return gpus
    finally:
        pynvml.nvmlShutdown()


def local_gpus(declared_spec: str) -> list[GPUInfo]:
    found = nvml_gpus()
    if found:
        return found
    return parse_declared(declared_spec)


# --- Clusters with their own scheduler (Slurm, Kubernetes) -------------------------------------


def gpus_by_node(found: list[GpuInfo]) -> dict[str, list[GPUInfo]]:
    """A backend's ``discover()`` (index ``node:i``, name = GPU type) as inventory GPUs, by node.

    Model and memory come from the type where the portal knows it (Slurm names only the type).
    """
    nodes: dict[str, list[GPUInfo]] = {}
    for info in found:
        node, _, index = info.index.rpartition(":")
        if not node or not index.isdigit():
            raise ValueError(f"GPU index {info.index!r}: expected NODE:INDEX")
        gpu_type = gpu_type_from_model(info.name)
        model, memory_mb, architecture = KNOWN_TYPES.get(gpu_type, (info.name, 0, ""))
        nodes.setdefault(node, []).append(
            GPUInfo(int(index), gpu_type, model, info.memory_mb or memory_mb, architecture, info.uuid)
        )
    return nodes
