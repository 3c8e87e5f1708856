"""How the portal writes GPUs and sizes, the one way for its pages, its API and (through the API's
`size` fields) its CLI: "1 × H100", "0.25 × H100", "1 × H100, 8 CPU, 64 GB"."""

from __future__ import annotations

from decimal import Decimal


def gpus_text(value: Decimal | float | int | None) -> str:
    """2.00 -> "2", 0.25 -> "0.25"."""
    if value is None:
        return "0"
    return f"{Decimal(str(value)).normalize():f}"


def gpus_of(count: Decimal | float | int | None, gpu_type: str | None) -> str:
    """How many GPUs of which type: (1, "h100") -> "1 × H100"."""
    return f"{gpus_text(count)} × {(gpu_type or 'GPU').upper()}"


def size_text(gpus: Decimal | float | int | None, gpu_type: str | None, cpu_cores: int, memory_gb: int) -> str:
    """One replica's size: "1 × H100, 8 CPU, 64 GB" ("2 CPU, 8 GB" without GPUs)."""
    held = f"{gpus_of(gpus, gpu_type)}, " if gpus else ""
    return f"{held}{cpu_cores} CPU, {memory_gb} GB"
