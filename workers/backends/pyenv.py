"""Python environments for notebooks: one virtualenv per package list, built once and cached.

An environment lives in ``<root>/<digest>/`` where the digest names the Python version and the
sorted requirements, so every notebook of a profile shares one. It is built in a temporary
directory under a file lock and renamed into place once complete: a worker that dies mid-build
leaves no half-made environment behind, and two workers never build the same one twice.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

from workers.backends.base import BackendError, PolicyRefusal

# What a notebook server needs, added to a profile's list unless it names its own version:
# JupyterLab (what "Open Jupyter" opens, as on JupyterHub), which brings the server.
JUPYTERLAB = "jupyterlab==4.4.10"
JUPYTER_SERVER = "jupyter_server==2.21.1"
IPYKERNEL = "ipykernel==7.4.0"
BUILD_TIMEOUT_S = 1800.0

_REQUIREMENT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._\[\],-]*\s*([<>=!~]=?\s*[A-Za-z0-9.*+!-]+\s*,?\s*)*$")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*")


def requirements_for(packages: list[str]) -> list[str]:
    """The profile's requirements plus the Jupyter server and kernel; refuses anything but
    plain requirement specifiers (no pip options, URLs or paths)."""
    wanted: list[str] = []
    for package in packages:
        package = str(package).strip()
        if not package or not _REQUIREMENT_RE.match(package):
            raise PolicyRefusal(f"{package!r} is not a package requirement such as 'pandas' or 'numpy==2.1.0'")
        wanted.append(package)
    names = {_canonical(p) for p in wanted}
    if not names & {"jupyterlab", "notebook"}:
        wanted.append(JUPYTERLAB)
        names.add("jupyterlab")
    if not names & {"jupyter-server", "jupyterlab", "notebook"}:
        wanted.append(JUPYTER_SERVER)
    if not names & {"ipykernel", "jupyterlab", "notebook"}:
        wanted.append(IPYKERNEL)
    return sorted(set(wanted))


def landing_path(env_dir: Path) -> str:
    """Where a browser opening the server lands: JupyterLab if the environment has it, else the
    classic notebook's tree, else the server's root."""
    try:
        names = {_canonical(line) for line in (env_dir / "requirements.txt").read_text().split()}
    except OSError:
        return "/lab"  # an environment made elsewhere (an image): JupyterLab, as the images have it
    return "/lab" if "jupyterlab" in names else "/tree" if "notebook" in names else "/"


def _canonical(requirement: str) -> str:
    match = _NAME_RE.match(requirement)
    return re.sub(r"[-_.]+", "-", match.group(0)).lower() if match else requirement


def env_digest(requirements: list[str], python: str = sys.executable) -> str:
    version = subprocess.run(
        [python, "-c", "import sys; print(sys.version)"], capture_output=True, text=True, check=True
    ).stdout.strip()
    blob = json.dumps({"python": version, "requirements": sorted(requirements)})
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def env_is_built(packages: list[str], root: Path, python: str = sys.executable) -> bool:
    """Whether ``ensure_env`` would return at once, the environment of ``packages`` being built."""
    return (root / env_digest(requirements_for(packages), python) / ".ready").exists()


def ensure_env(packages: list[str], root: Path, python: str = sys.executable) -> Path:
    """Return the directory of a virtualenv holding ``packages`` and a Jupyter server, building it
    if it is not there yet. ``BackendError`` (transient) if pip fails, with its last lines."""
    requirements = requirements_for(packages)
    root.mkdir(parents=True, exist_ok=True)
    target = root / env_digest(requirements, python)
    if (target / ".ready").exists():
        return target
    with open(root / f"{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another worker may be building it: wait for it
        if (target / ".ready").exists():
            return target
        building = root / f"{target.name}.building"
        shutil.rmtree(building, ignore_errors=True)
        shutil.rmtree(target, ignore_errors=True)
        try:
            _run([python, "-m", "venv", str(building)])
            pip = [str(building / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
            _run([*pip, *requirements])
            (building / "requirements.txt").write_text("\n".join(requirements) + "\n")
            _readable_by_all(building)
            (building / ".ready").write_text("")
            building.rename(target)
        except BaseException:
            shutil.rmtree(building, ignore_errors=True)
            raise
    return target


def _readable_by_all(root: Path) -> None:
    """Environments are read (never written) by every workspace's account: whatever the portal's
    umask (the embedded portal's is 077), give everyone read and, where the owner has it, execute."""
    for path in [root, *root.rglob("*")]:
        if path.is_symlink():
            continue
        mode = path.stat().st_mode
        extra = stat.S_IRGRP | stat.S_IROTH
        if mode & stat.S_IXUSR or path.is_dir():
            extra |= stat.S_IXGRP | stat.S_IXOTH
        path.chmod((mode | extra) & ~(stat.S_IWGRP | stat.S_IWOTH))


def _run(argv: list[str]) -> None:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        raise BackendError(
            f"building the notebook environment timed out: {' '.join(argv[:4])}", permanent=False
        ) from exc
    if done.returncode != 0:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-5:])
        raise BackendError(f"building the notebook environment failed: {tail}", permanent=False)
