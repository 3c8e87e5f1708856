"""The portal's image recipe (deploy/image): no image can be built here, so its build steps
(deploy/image/build-steps.sh, which the Containerfile runs) run here as the image runs them: the pinned
requirements installed into a fresh virtualenv (on top of the suite's, so that only what it lacks is
installed), the Node packages from the lock file, the static files collected; and the Containerfile is read
to check that it runs those steps, as a user that is not root, with the entrypoint the chart calls."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from tests.deploy.conftest import BUILD_STEPS
from tests.deploy.helm import ROOT

IMAGE = ROOT / "deploy" / "image"


def _instructions() -> list[tuple[str, str]]:
    """The Containerfile's instructions, continuation lines joined: (INSTRUCTION, arguments)."""
    text = re.sub(r"\\\n\s*", " ", (IMAGE / "Containerfile").read_text())
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in lines]


def test_the_containerfile_runs_the_build_steps_as_a_user_that_is_not_root() -> None:
    instructions = _instructions()
    steps = [
        word
        for op, args in instructions
        if op == "RUN" and "build-steps.sh" in args
        for part in args.split("&&")
        if "build-steps.sh" in part
        for word in part.split()[1:]
    ]
    assert steps == ["python", "node", "static"]
    # Every file the recipe copies exists in the repository.
    for op, args in instructions:
        if op == "COPY":
            *sources, _ = args.split()
            assert all((ROOT / source).exists() for source in sources if source != "."), args
    user = [args for op, args in instructions if op == "USER"]
    assert user and not user[-1].startswith(("0", "root"))
    assert ("ENTRYPOINT", '["/app/deploy/image/entrypoint.sh"]') in instructions
    env = " ".join(args for op, args in instructions if op == "ENV")
    assert "STATIC_ROOT=/app/collected-static" in env and "PORTAL_VENV=/opt/venv" in env
    # What the build context leaves out: the local virtualenv, Node packages and data.
    ignored = (IMAGE / "Containerfile.dockerignore").read_text().split()
    assert {".venv", "node_modules", "var", ".git"} <= set(ignored)


def test_the_python_step_installs_the_pinned_requirements_into_a_new_virtualenv(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = Path(sysconfig.get_path("purelib", vars={"base": str(venv), "platbase": str(venv)}))
    # The suite's packages are visible to it, so that only what they lack is downloaded and installed.
    (site / "suite.pth").write_text(sysconfig.get_path("purelib") + "\n")
    done = subprocess.run([str(BUILD_STEPS), "python"], env={**os.environ, "PORTAL_VENV": str(venv)},
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    installed = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "check"], capture_output=True, text=True)
    assert installed.returncode == 0, installed.stdout
    # The repository's SDK is installed into the new environment itself.
    found = subprocess.run([str(venv / "bin" / "python"), "-c", "import gpuportal; print(gpuportal.__file__)"],
                           capture_output=True, text=True, check=True)  # fmt: skip
    assert found.stdout.startswith(str(ROOT / "sdk"))
    assert list(site.glob("*gpuportal*"))


def test_the_node_step_installs_the_locked_packages_the_portal_runs(tmp_path: Path) -> None:
    tree = tmp_path / "app"
    (tree / "deploy" / "image").mkdir(parents=True)
    for name in ("package.json", "package-lock.json"):
        shutil.copy(ROOT / name, tree / name)
    shutil.copy(BUILD_STEPS, tree / "deploy" / "image" / "build-steps.sh")
    env = {**os.environ, "npm_config_prefer_offline": "true"}
    subprocess.run([str(tree / "deploy" / "image" / "build-steps.sh"), "node"], env=env, check=True, timeout=300)
    assert os.access(tree / "node_modules" / ".bin" / "configurable-http-proxy", os.X_OK)
    dev = json.loads((ROOT / "package.json").read_text())["devDependencies"]
    assert not [name for name in dev if (tree / "node_modules" / name).exists()]


def test_the_static_step_collects_every_file_the_pages_use(collected_static: Path) -> None:
    manifest = json.loads((collected_static / "staticfiles.json").read_text())
    assert {"web/favicon.svg", "web/portal.css", "web/live.js"} <= set(manifest["paths"])
    for hashed in manifest["paths"].values():
        assert (collected_static / hashed).is_file()
