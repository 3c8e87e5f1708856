"""Where the SDK finds the portal and token, and the CLI's help: no portal needed."""

from __future__ import annotations

import stat
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from gpuportal import Client, ConfigError
from gpuportal.cli import cli
from gpuportal.config import Config, config_path, write_file


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in ("GPUPORTAL_URL", "GPUPORTAL_TOKEN", "GPUPORTAL_WORKSPACE", "GPUPORTAL_CONFIG", "XDG_CONFIG_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    return tmp_path


def test_the_config_file_lives_in_the_users_config_folder(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert config_path() == home / ".config" / "gpuportal" / "config.yaml"
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / "xdg"))
    assert config_path() == home / "xdg" / "gpuportal" / "config.yaml"


def test_from_env_reads_the_variables_and_falls_back_to_the_file(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="No portal url and token configured"):
        Client.from_env()
    path = write_file(Config(url="http://portal.test:8000", token="file-token", workspace="team-a"))
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    with Client.from_env() as client:
        assert (client.url, client.token, client.workspace) == ("http://portal.test:8000", "file-token", "team-a")
    monkeypatch.setenv("GPUPORTAL_TOKEN", "env-token")
    monkeypatch.setenv("GPUPORTAL_URL", "https://other.test/")
    with Client.from_env() as client:
        assert (client.url, client.token, client.workspace) == ("https://other.test", "env-token", "team-a")
    with Client.from_config() as client:  # the file only
        assert (client.url, client.token) == ("http://portal.test:8000", "file-token")


def test_a_broken_config_is_reported_not_raised_as_a_traceback(home: Path) -> None:
    path = config_path()
    path.parent.mkdir(parents=True)
    path.write_text("url: [unclosed\n")
    with pytest.raises(ConfigError, match="is not valid YAML"):
        Client.from_config()
    path.write_text("url: ftp://portal\ntoken: t\n")
    with pytest.raises(ConfigError, match="should start with http:// or https://"):
        Client.from_config()
    result = CliRunner().invoke(cli, ["ls"])
    assert result.exit_code == 1
    assert result.output.startswith("Error: The portal URL should start with http:// or https://")


def _commands(group: click.Group, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    found = [prefix]
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            found += _commands(command, (*prefix, name))
        else:
            found.append((*prefix, name))
    return found


def test_every_command_has_help_with_examples() -> None:
    commands = _commands(cli)
    assert ("submit",) in commands and ("artifacts", "get") in commands and ("notebooks", "launch") in commands
    for path in commands:
        result = CliRunner().invoke(cli, [*path, "--help"])
        assert result.exit_code == 0, (path, result.output)
        assert "Examples:\n    gpuportal " in result.output, (path, result.output)
