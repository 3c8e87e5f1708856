"""Orchestration backends: where workloads run. ``base.Backend``'s docstring is the contract."""

from workers.backends.base import (
    Artifact,
    Backend,
    BackendError,
    Endpoint,
    GpuInfo,
    JobSpec,
    PolicyRefusal,
    Progress,
    Status,
)

__all__ = [
    "Artifact",
    "Backend",
    "BackendError",
    "Endpoint",
    "GpuInfo",
    "JobSpec",
    "PolicyRefusal",
    "Progress",
    "Status",
]
