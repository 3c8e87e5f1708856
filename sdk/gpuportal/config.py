"""Where the SDK and CLI find the portal and the token.

The configuration file is YAML, ``~/.config/gpuportal/config.yaml`` (``$XDG_CONFIG_HOME`` is
honoured; ``GPUPORTAL_CONFIG`` names another file):

    url: http://127.0.0.1:8000
    token: 0123abcd...
    workspace: demo-team        # optional: where jobs and instances go when none is named

The environment variables ``GPUPORTAL_URL``, ``GPUPORTAL_TOKEN`` and ``GPUPORTAL_WORKSPACE``
override the file.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gpuportal.errors import ConfigError

DEFAULT_URL = "http://127.0.0.1:8000"
KEYS = ("url", "token", "workspace")


def config_path() -> Path:
    """The configuration file in use."""
    explicit = os.environ.get("GPUPORTAL_CONFIG")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "gpuportal" / "config.yaml"


@dataclass
class Config:
    url: str | None = None
    token: str | None = None
    workspace: str | None = None

    def merged(self, other: Config) -> Config:
        """This configuration with the values `other` sets taking precedence."""
        return Config(
            url=other.url or self.url,
            token=other.token or self.token,
            workspace=other.workspace or self.workspace,
        )


def read_file(path: Path | None = None) -> Config:
    """The configuration file's values; an empty configuration where there is no file."""
    path = path or config_path()
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return Config()
    except OSError as exc:
        raise ConfigError(f"Cannot read the configuration file {path}: {exc.strerror}.") from None
    try:
        data: Any = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"The configuration file {path} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"The configuration file {path} should hold keys: {', '.join(KEYS)}.")
    values = {key: data.get(key) for key in KEYS}
    for key, value in values.items():
        if value is not None and not isinstance(value, str):
            raise ConfigError(f"The configuration file {path}: {key} should be a string.")
    return Config(**values)


def read_env() -> Config:
    return Config(
        url=os.environ.get("GPUPORTAL_URL") or None,
        token=os.environ.get("GPUPORTAL_TOKEN") or None,
        workspace=os.environ.get("GPUPORTAL_WORKSPACE") or None,
    )


def resolve(path: Path | None = None) -> Config:
    """The file's values, overridden by the environment's."""
    return read_file(path).merged(read_env())


def write_file(config: Config, path: Path | None = None) -> Path:
    """Save `config`, readable by its owner only (it holds a token); returns the path."""
    path = path or config_path()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    data = {key: getattr(config, key) for key in KEYS if getattr(config, key)}
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".config-", suffix=".yaml")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write("# GPU Portal: written by `gpuportal login`\n")
            yaml.safe_dump(data, handle, default_flow_style=False, sort_keys=False)
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
