"""Job specs: a YAML (or JSON) file, a dict or keyword arguments, checked before they are sent.

    name: train-resnet
    workspace: demo-team
    script: train.sh            # or `command: python train.py`; a path is relative to this file
    env: {EPOCHS: "10"}
    gpus: 2                     # per replica; 0.25, 0.333, 0.5, 0.667, 0.75: a share of one GPU
    gpu_type: h100              # may be left out where the workspace has one GPU type
    replicas: 2                 # a gang: all replicas start together
    priority: 10
    max_runtime: 2h             # seconds, or 90s, 30m, 2h, 1d, 1h30m
    artifacts: [out/model.pt, logs]

Types are checked here, with a message naming the field; the portal checks values (name
format, bounds, quotas) and answers in the same way.
"""

from __future__ import annotations

import difflib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

import yaml

from gpuportal.errors import SpecError

# Spec field -> the API's name for it, where they differ.
ALIASES = {"gpus_per_replica": "gpus", "max_runtime_s": "max_runtime", "artifact_paths": "artifacts"}
FIELDS = (
    "name", "workspace", "description", "command", "script", "image", "env", "gpus", "gpu_type", "replicas",
    "cpu_cores", "memory_gb", "priority", "preemptible", "checkpointable", "max_runtime", "artifacts", "cluster",
)  # fmt: skip
KINDS = ("job", "ray")
_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
NAME_RULE = "use 1 to 63 lowercase letters, digits or '-', starting and ending with a letter or digit"
_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*([smhd])")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


@dataclass
class JobSpec:
    """What a job asks for. ``to_api()`` gives the body of ``POST /api/v1/jobs/``."""

    name: str | None = None
    workspace: str | None = None
    command: str = ""
    image: str = ""
    description: str = ""
    env: dict[str, str] = field(default_factory=dict)
    gpus: Decimal = Decimal("0")
    gpu_type: str = ""
    replicas: int = 1
    cpu_cores: int | None = None
    memory_gb: int | None = None
    priority: int = 0
    preemptible: bool | None = None
    checkpointable: bool | None = None
    max_runtime_s: int | None = None
    artifacts: list[str] = field(default_factory=list)
    cluster: str | None = None

    @classmethod
    def load(
        cls, spec: JobSpec | Mapping[str, Any] | str | os.PathLike[str] | None = None, **overrides: Any
    ) -> JobSpec:
        """A spec from a file path, a mapping or another spec, with `overrides` (keyword arguments) on top."""
        source: str | None = None
        base_dir = Path.cwd()
        default_name: str | None = None
        if isinstance(spec, JobSpec):
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
            raise SpecError(f"a spec is a dict, a path to a YAML file, or keyword arguments, not {type(spec).__name__}")
        given = {k: v for k, v in overrides.items() if v is not None}
        if "command" in given or "script" in given:  # an override replaces the spec's own command or script
            values.pop("script" if "command" in given else "command", None)
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
    ) -> JobSpec:
        """Check every field's type; ``script`` is read (relative to `base_dir`) into the command."""
        values = {ALIASES.get(str(k), str(k)): v for k, v in values.items()}
        kind = spec_kind(values)
        if kind != "job":
            raise SpecError(
                "a Ray spec: submit it with `gpuportal submit`, or client.ray_clusters.create()", field="kind"
            )
        values.pop("kind", None)
        unknown = [k for k in values if k not in FIELDS]
        if unknown:
            close = difflib.get_close_matches(unknown[0], FIELDS, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else f"; the fields are: {', '.join(FIELDS)}"
            raise SpecError(f"not a job spec field{hint}", field=unknown[0])
        spec = cls(
            name=_optional_str(values, "name"),
            workspace=_optional_str(values, "workspace"),
            command=_command(values, base_dir or Path.cwd()),
            image=_optional_str(values, "image") or "",
            description=_optional_str(values, "description") or "",
            env=_env(values.get("env")),
            gpus=_gpus(values.get("gpus")),
            gpu_type=_optional_str(values, "gpu_type") or "",
            replicas=_int(values, "replicas", minimum=1) or 1,
            cpu_cores=_int(values, "cpu_cores", minimum=1),
            memory_gb=_int(values, "memory_gb", minimum=1),
            priority=_int(values, "priority") or 0,
            preemptible=_bool(values, "preemptible"),
            checkpointable=_bool(values, "checkpointable"),
            max_runtime_s=_duration(values.get("max_runtime")),
            artifacts=_paths(values.get("artifacts")),
            cluster=_optional_str(values, "cluster"),
        )
        if not spec.command and not spec.image:
            raise SpecError("give the job a command or a script", field="command")
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

    def to_fields(self) -> dict[str, Any]:
        """The spec as spec-file fields (what ``from_dict`` reads back)."""
        values: dict[str, Any] = {
            "name": self.name, "workspace": self.workspace, "command": self.command or None,
            "image": self.image or None, "description": self.description or None, "env": self.env or None,
            "gpus": self.gpus or None, "gpu_type": self.gpu_type or None, "replicas": self.replicas,
            "cpu_cores": self.cpu_cores, "memory_gb": self.memory_gb, "priority": self.priority,
            "preemptible": self.preemptible, "checkpointable": self.checkpointable,
            "max_runtime": self.max_runtime_s, "artifacts": self.artifacts or None, "cluster": self.cluster,
        }  # fmt: skip
        return {k: v for k, v in values.items() if v is not None}

    def to_api(self) -> dict[str, Any]:
        """The request body for the jobs endpoint."""
        body: dict[str, Any] = {
            "name": self.name,
            "workspace": self.workspace,
            "command": self.command,
            "image": self.image,
            "description": self.description,
            "env": self.env,
            "gpus_per_replica": f"{self.gpus.normalize():f}",
            "replicas": self.replicas,
            "priority": self.priority,
            "artifact_paths": self.artifacts,
        }
        if self.gpus:
            body["gpu_type"] = self.gpu_type
        optional = {
            "cpu_cores": self.cpu_cores,
            "memory_gb": self.memory_gb,
            "preemptible": self.preemptible,
            "checkpointable": self.checkpointable,
            "max_runtime_s": self.max_runtime_s,
            "cluster": self.cluster,
        }
        body.update({k: v for k, v in optional.items() if v is not None})
        return body


def spec_kind(values: Mapping[str, Any]) -> str:
    """What a spec asks for: ``job`` (the default) or ``ray`` (a Ray cluster with an entrypoint)."""
    kind = values.get("kind", "job")
    if kind not in KINDS:
        raise SpecError(f"should be one of {', '.join(KINDS)}, not {_describe(kind)}", field="kind")
    return str(kind)


def read_spec_file(path: Path) -> dict[str, Any]:
    """A spec file's top-level mapping (YAML, of which JSON is a subset)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError("no such file", source=str(path)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(f"cannot read it ({exc})", source=str(path)) from None
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (yaml.YAMLError, json.JSONDecodeError) as exc:
        raise SpecError(
            f"not valid {'JSON' if path.suffix == '.json' else 'YAML'}: {_first_line(exc)}", source=str(path)
        ) from None
    if not isinstance(data, dict):
        raise SpecError("a job spec is a mapping of fields (name: ..., command: ...)", source=str(path))
    return data


def dns_label(text: str) -> str:
    """`text` made into a name the portal accepts: lowercase letters, digits and '-', 63 at most."""
    label = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    return re.sub(r"-{2,}", "-", label)[:63].strip("-")


def parse_duration(value: str) -> int:
    """Seconds in ``90``, ``90s``, ``30m``, ``2h``, ``1d`` or ``1h30m``; ValueError otherwise."""
    text = value.strip().lower()
    if text.isdigit():
        return int(text)
    parts = _DURATION.findall(text)
    if not parts or _DURATION.sub("", text).strip():
        raise ValueError(value)
    return int(sum(float(number) * _UNITS[unit] for number, unit in parts))


def _first_line(exc: Exception) -> str:
    mark = getattr(exc, "problem_mark", None)
    if isinstance(exc, yaml.MarkedYAMLError) and mark is not None:
        return f"{exc.problem} (line {mark.line + 1}, column {mark.column + 1})"
    return " ".join(str(exc).split())


def _optional_str(values: Mapping[str, Any], key: str) -> str | None:
    value = values.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise SpecError(f"should be text, not {_describe(value)}", field=key)
    return value


def _command(values: Mapping[str, Any], base_dir: Path, key: str = "command", noun: str = "a command") -> str:
    """The text of ``key`` (a job's command, a Ray spec's entrypoint), or of the file ``script`` names."""
    command, script = _optional_str(values, key), _optional_str(values, "script")
    if command and script:
        raise SpecError(f"give either {noun} or a script, not both", field="script")
    if not script:
        return command or ""
    path = (base_dir / Path(script).expanduser()).resolve()
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError(f"no such file: {path}", field="script") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(f"cannot read {path}: {exc}", field="script") from None


def _env(value: Any) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise SpecError(f"should be a mapping of NAME: value, not {_describe(value)}", field="env")
    env: dict[str, str] = {}
    for key, item in value.items():
        if isinstance(item, bool):
            env[str(key)] = "true" if item else "false"
        elif isinstance(item, (str, int, float, Decimal)):
            env[str(key)] = str(item)
        elif item is None:
            env[str(key)] = ""
        else:
            raise SpecError(f"should be text or a number, not {_describe(item)}", field=f"env.{key}")
    return env


def _gpus(value: Any) -> Decimal:
    if value is None:
        return Decimal("0")
    if isinstance(value, bool) or not isinstance(value, (int, float, str, Decimal)):
        raise SpecError(f"should be a number of GPUs per replica (1, 8, 0.25), not {_describe(value)}", field="gpus")
    try:
        gpus = Decimal(str(value).strip())
    except InvalidOperation:
        raise SpecError(f"should be a number of GPUs per replica (1, 8, 0.25), not {value!r}", field="gpus") from None
    if not gpus.is_finite() or gpus < 0:
        raise SpecError(f"should be 0 or more, not {value}", field="gpus")
    return gpus


def _int(values: Mapping[str, Any], key: str, minimum: int | None = None) -> int | None:
    value = values.get(key)
    if value is None:
        return None
    if isinstance(value, str) and re.fullmatch(r"-?\d+", value.strip()):
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError(f"should be a whole number, not {_describe(value)}", field=key)
    if minimum is not None and value < minimum:
        raise SpecError(f"should be at least {minimum}, not {value}", field=key)
    return value


def _bool(values: Mapping[str, Any], key: str) -> bool | None:
    value = values.get(key)
    if value is None or isinstance(value, bool):
        return value
    raise SpecError(f"should be true or false, not {_describe(value)}", field=key)


def _duration(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        seconds = value
    elif isinstance(value, str):
        try:
            seconds = parse_duration(value)
        except ValueError:
            raise SpecError(
                f"should be seconds or a duration such as 90s, 30m, 2h, not {value!r}", field="max_runtime"
            ) from None
    else:
        raise SpecError(
            f"should be seconds or a duration such as 30m or 2h, not {_describe(value)}", field="max_runtime"
        )
    if seconds < 1:
        raise SpecError("should be at least 1 second", field="max_runtime")
    return seconds


def _paths(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise SpecError(
            f"should be a list of paths relative to the job's directory, not {_describe(value)}", field="artifacts"
        )
    return list(value)


def _describe(value: Any) -> str:
    kinds = {bool: "true/false", int: "a number", float: "a number", str: "text", list: "a list", dict: "a mapping"}
    kind = next((name for cls, name in kinds.items() if isinstance(value, cls)), type(value).__name__)
    shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
    return f"{kind} ({shown})"
