"""A notebook environment carries JupyterLab's defaults for its users (overrides.json): no prompt
asking whether to fetch Jupyter's news from outside, in environments built now and before."""

from __future__ import annotations

import json
import os
from pathlib import Path

from workers.backends import pyenv


def test_an_environment_built_before_gets_the_settings_at_its_next_use(tmp_path: Path) -> None:
    env = tmp_path / "built-earlier"
    env.mkdir()
    (env / ".ready").write_text("")
    overrides = env / "share" / "jupyter" / "lab" / "settings" / "overrides.json"
    assert not overrides.exists()

    umask = os.umask(0o077)  # a worker's umask may keep what it writes to itself
    try:
        assert pyenv._ensure(env, "python3", [], system_site_packages=False) == env  # ready: nothing rebuilt
    finally:
        os.umask(umask)

    settings = json.loads(overrides.read_text())
    assert settings["@jupyterlab/apputils-extension:notification"]["fetchNews"] == "false"
    # every workspace's account reads it, whatever the umask of the worker that wrote it
    assert overrides.stat().st_mode & 0o777 == 0o644 and overrides.parent.stat().st_mode & 0o777 == 0o755


def test_settings_someone_wrote_are_kept(tmp_path: Path) -> None:
    env = tmp_path / "env"
    overrides = env / "share" / "jupyter" / "lab" / "settings" / "overrides.json"
    overrides.parent.mkdir(parents=True)
    (env / ".ready").write_text("")
    overrides.write_text('{"@jupyterlab/apputils-extension:themes": {"theme": "JupyterLab Dark"}}')
    pyenv._ensure(env, "python3", [], system_site_packages=False)
    assert "Dark" in overrides.read_text()
