"""Ray cluster specs: what a Ray cluster (or a Ray job) asks for, from a spec file with
``kind: ray``, a dict or keyword arguments, checked before it is sent (types here; values, bounds
and quotas by the portal, which answers naming the field).

    kind: ray
    name: tune
    workspace: demo-team
    entrypoint: python tune.py      # or `script: tune.sh`; a path is relative to this file
    workers: 2
    worker_gpus: 1                  # per worker; head_gpus for the head
    worker_cpus: 4                  # whole cores; head_cpus
    worker_memory: 16               # GB, or 16G, 512Mi; head_memory
    max_runtime: 2h
    artifacts: [results]
"""

from __future__ import annotations

import difflib
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

from gpuportal.errors import SpecError
from gpuportal.spec import (
    _LABEL,
    NAME_RULE,
    _bool,
    _command,
    _describe,
    _duration,
    _env,
    _int,
    _optional_str,
    _paths,
    dns_label,
    read_spec_file,
)

# Other names a spec may use for a field (the API's, and CodeFlare's) -> the spec's own.
RAY_ALIASES = {
    "head_cpu_cores": "head_cpus", "head_memory_gb": "head_memory", "worker_cpu_cores": "worker_cpus",
    "worker_memory_gb": "worker_memory", "num_workers": "workers", "envs": "env", "max_runtime_s": "max_runtime",
    "artifact_paths": "artifacts",
}  # fmt: skip
RAY_FIELDS = (
    "kind", "name", "workspace", "description", "entrypoint", "script", "image", "env", "workers", "gpu_type",
    "head_gpus", "head_cpus", "head_memory", "worker_gpus", "worker_cpus", "worker_memory", "head_profile",
    "worker_profile", "priority", "preemptible", "max_runtime", "artifacts", "cluster",
)  # fmt: skip
# The API's field -> the spec's, to name a field the portal refused as the spec does.
API_TO_SPEC = {
    "head_cpu_cores": "head_cpus", "head_memory_gb": "head_memory", "worker_cpu_cores": "worker_cpus",
    "worker_memory_gb": "worker_memory", "max_runtime_s": "max_runtime", "artifact_paths": "artifacts",
}  # fmt: skip
_SIZE = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*([kmgt]?)(i?)b?", re.IGNORECASE)
_GB_PER = {"k": 1 / 1024**2, "m": 1 / 1024, "g": 1.0, "t": 1024.0}


def parse_memory_gb(value: Any, key: str) -> int:
    """Whole GB (rounded up) from a number of GB or a size with a unit: ``8``, ``"8G"``, ``"8Gi"``,
    ``"512Mi"``. The portal counts memory in whole GB, as both a node's reservation and its limit."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str, Decimal)):
        raise SpecError(f"should be GB (8) or a size such as 8G or 512Mi, not {_describe(value)}", field=key)
    if isinstance(value, str):
        found = _SIZE.fullmatch(value.strip())
        if not found:
            raise SpecError(f"should be GB (8) or a size such as 8G or 512Mi, not {value!r}", field=key)
        amount = float(found.group(1)) * _GB_PER[(found.group(2) or "g").lower()]
    else:
        amount = float(value)
    if amount < 0:
        raise SpecError(f"should be 0 or more, not {value}", field=key)
    return math.ceil(amount)


def parse_cpus(value: Any, key: str) -> int:
    """Whole CPU cores (rounded up) from a number or Kubernetes' notation: ``2``, ``"2"``, ``"500m"``."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str, Decimal)):
        raise SpecError(f"should be a number of CPU cores (2, or 500m), not {_describe(value)}", field=key)
    text = str(value).strip().lower()
    try:
        cores = Decimal(text[:-1]) / 1000 if text.endswith("m") else Decimal(text)
    except InvalidOperation:
        raise SpecError(f"should be a number of CPU cores (2, or 500m), not {value!r}", field=key) from None
    if not cores.is_finite() or cores < 0:
        raise SpecError(f"should be 0 or more, not {value}", field=key)
    return math.ceil(cores)


def parse_gpus(value: Any, key: str) -> Decimal:
    """GPUs per node: ``1``, ``8``, or a share of one device such as ``0.5``."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str, Decimal)):
        raise SpecError(f"should be a number of GPUs per node (1, 8, 0.5), not {_describe(value)}", field=key)
    try:
        gpus = Decimal(str(value).strip())
    except InvalidOperation:
        raise SpecError(f"should be a number of GPUs per node (1, 8, 0.5), not {value!r}", field=key) from None
    if not gpus.is_finite() or gpus < 0:
        raise SpecError(f"should be 0 or more, not {value}", field=key)
    return gpus


@dataclass
class RayClusterSpec:
    """What a Ray cluster asks for, in the spec file's words. Sizes left as None take the portal's
    defaults (one worker; each node 1 core and 4 GB, no GPU). ``to_api()`` is the request body."""

    name: str | None = None
    workspace: str | None = None
    description: str = ""
    entrypoint: str = ""
    image: str = ""
    env: dict[str, str] = field(default_factory=dict)
    workers: int | None = None
    gpu_type: str = ""
    head_gpus: Decimal | None = None
    head_cpus: int | None = None
    head_memory: int | None = None
    worker_gpus: Decimal | None = None
    worker_cpus: int | None = None
    worker_memory: int | None = None
    head_profile: str | None = None
    worker_profile: str | None = None
    priority: int | None = None
    preemptible: bool | None = None
    max_runtime_s: int | None = None
    artifacts: list[str] = field(default_factory=list)
    cluster: str | None = None

    @classmethod
    def load(
        cls, spec: RayClusterSpec | Mapping[str, Any] | str | os.PathLike[str] | None = None, **overrides: Any
    ) -> RayClusterSpec:
        """A spec from a file path, a mapping or another spec, with `overrides` on top."""
        source, base_dir, default_name = None, Path.cwd(), None
        if isinstance(spec, RayClusterSpec):
            values: dict[str, Any] = spec.to_fields()
        elif isinstance(spec, Mapping):
            values = dict(spec)
        elif isinstance(spec, (str, os.PathLike)):
            path = Path(spec)
            values, source = read_spec_file(path), str(path)
            base_dir, default_name = path.parent, path.stem
        elif spec is None:
            values = {}
        else:
            raise SpecError(f"a Ray spec is a dict, a path to a YAML file, or keyword arguments, not {_describe(spec)}")
        given = {k: v for k, v in overrides.items() if v is not None}
        if "entrypoint" in given or "script" in given:  # an override replaces the spec's own
            values.pop("script" if "entrypoint" in given else "entrypoint", None)
        values.update(given)
        try:
            return cls.from_dict(values, base_dir=base_dir, default_name=default_name)
        except SpecError as exc:
            if source and exc.source is None:
                raise SpecError(exc.reason, field=exc.field, source=source) from None
            raise

    @classmethod
    def from_dict(
        cls, values: Mapping[str, Any], *, base_dir: Path | None = None, default_name: str | None = None
    ) -> RayClusterSpec:
        """Check each field's type; ``script`` is read (relative to `base_dir`) into the entrypoint."""
        values = {RAY_ALIASES.get(str(k), str(k)): v for k, v in values.items()}
        unknown = [k for k in values if k not in RAY_FIELDS]
        if unknown:
            close = difflib.get_close_matches(unknown[0], RAY_FIELDS, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else f"; the fields are: {', '.join(RAY_FIELDS)}"
            raise SpecError(f"not a Ray spec field{hint}", field=unknown[0])
        if values.get("kind", "ray") != "ray":
            raise SpecError(f"a Ray spec has kind: ray, not {_describe(values['kind'])}", field="kind")
        spec = cls(
            name=_optional_str(values, "name"),
            workspace=_optional_str(values, "workspace"),
            description=_optional_str(values, "description") or "",
            entrypoint=_command(values, base_dir or Path.cwd(), "entrypoint", "an entrypoint"),
            image=_optional_str(values, "image") or "",
            env=_env(values.get("env")),
            workers=_int(values, "workers", minimum=0),
            gpu_type=_optional_str(values, "gpu_type") or "",
            head_profile=_optional_str(values, "head_profile"),
            worker_profile=_optional_str(values, "worker_profile"),
            priority=_int(values, "priority"),
            preemptible=_bool(values, "preemptible"),
            max_runtime_s=_duration(values.get("max_runtime")),
            artifacts=_paths(values.get("artifacts")),
            cluster=_optional_str(values, "cluster"),
        )
        for role in ("head", "worker"):
            if values.get(f"{role}_gpus") is not None:
                setattr(spec, f"{role}_gpus", parse_gpus(values[f"{role}_gpus"], f"{role}_gpus"))
            if values.get(f"{role}_cpus") is not None:
                setattr(spec, f"{role}_cpus", parse_cpus(values[f"{role}_cpus"], f"{role}_cpus"))
            if values.get(f"{role}_memory") is not None:
                setattr(spec, f"{role}_memory", parse_memory_gb(values[f"{role}_memory"], f"{role}_memory"))
        if spec.name is None:
            script = values.get("script")
            stem = Path(str(script)).stem if script else default_name
            spec.name = dns_label(stem) if stem else None
        if not spec.name:
            raise SpecError(f"required: {NAME_RULE}", field="name")
        for key in ("name", "workspace", "cluster"):
            value = getattr(spec, key)
            if value is not None and not _LABEL.fullmatch(value):
                raise SpecError(f"{value!r} is not a name: {NAME_RULE}", field=key)
        return spec

    @property
    def has_gpus(self) -> bool:
        return bool(self.head_gpus or self.worker_gpus)

    def to_fields(self) -> dict[str, Any]:
        """The spec as spec-file fields (what ``from_dict`` reads back)."""
        values: dict[str, Any] = {
            "name": self.name, "workspace": self.workspace, "description": self.description or None,
            "entrypoint": self.entrypoint or None, "image": self.image or None, "env": self.env or None,
            "workers": self.workers, "gpu_type": self.gpu_type or None, "head_gpus": self.head_gpus,
            "head_cpus": self.head_cpus, "head_memory": self.head_memory, "worker_gpus": self.worker_gpus,
            "worker_cpus": self.worker_cpus, "worker_memory": self.worker_memory, "head_profile": self.head_profile,
            "worker_profile": self.worker_profile, "priority": self.priority, "preemptible": self.preemptible,
            "max_runtime": self.max_runtime_s, "artifacts": self.artifacts or None, "cluster": self.cluster,
        }  # fmt: skip
        return {k: v for k, v in values.items() if v is not None}

    def to_api(self) -> dict[str, Any]:
        """The request body for ``POST /api/v1/ray-clusters/``; what is left out takes the portal's default."""
        body: dict[str, Any] = {
            "name": self.name,
            "workspace": self.workspace,
            "description": self.description,
            "entrypoint": self.entrypoint,
            "image": self.image,
            "env": self.env,
            "artifact_paths": self.artifacts,
        }
        optional = {
            "workers": self.workers,
            "gpu_type": self.gpu_type or None,
            "head_gpus": None if self.head_gpus is None else f"{self.head_gpus.normalize():f}",
            "head_cpu_cores": self.head_cpus,
            "head_memory_gb": self.head_memory,
            "worker_gpus": None if self.worker_gpus is None else f"{self.worker_gpus.normalize():f}",
            "worker_cpu_cores": self.worker_cpus,
            "worker_memory_gb": self.worker_memory,
            "head_profile": self.head_profile,
            "worker_profile": self.worker_profile,
            "priority": self.priority,
            "preemptible": self.preemptible,
            "max_runtime_s": self.max_runtime_s,
            "cluster": self.cluster,
        }
        body.update({k: v for k, v in optional.items() if v is not None})
        return body
