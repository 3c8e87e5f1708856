"""Python environments for workloads: one virtualenv per package list, built once and cached.

A notebook's environment lives in ``<root>/<digest>/`` where the digest names the Python version,
the sorted requirements and the portal's SDK, so every notebook of a profile shares one. Jobs and
instances get the SDK's own environment, ``<root>/sdk-<digest>/``: the SDK on top of the Python's
own packages; Ray clusters on Slurm the Ray environment, ``<root>/ray-<digest>/``; an inference
endpoint's replicas the environment of their model server, ``<root>/serve-<kind>-<digest>/``. Every
environment has the portal's SDK and CLI (the ``gpuportal`` package, installed from this
checkout's ``sdk/``), so that a workload can drive the portal at once with the ``GPUPORTAL_*``
variables its backend sets.

An environment is built in a temporary directory under a file lock and renamed into place once
complete: a worker that dies mid-build leaves no half-made environment behind, and two workers
never build the same one twice. A build says who started it and when in ``<name>.building.json``
beside it, so that a start that finds it under way can say what it waits for; each build's
duration is kept in ``builds.json`` in the root, and the median of the earlier builds of the same
packages is what a build is expected to take (``expected_build_s``). A start hands its
``StartSteps`` (workers/backends/steps.py) to the ``ensure_*`` functions, which report there what
they do: the environment was built earlier, another build is waited for, or one is made now.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import os
import re
import shutil
import stat
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from workers.backends import servers
from workers.backends.base import BackendError, PolicyRefusal
from workers.backends.steps import ENVIRONMENT, StartSteps, describe_duration

# What a notebook server needs, added to a profile's list unless it names its own version:
# JupyterLab (what "Open Jupyter" opens, as on JupyterHub), which brings the server.
JUPYTERLAB = "jupyterlab==4.4.10"
JUPYTER_SERVER = "jupyter_server==2.21.1"
IPYKERNEL = "ipykernel==7.4.0"
BUILD_TIMEOUT_S = 1800.0
#: Where the durations of an environment root's builds are kept, and how many of each.
BUILDS_FILE = "builds.json"
BUILDS_KEPT = 20
#: The Ray of the Ray environment (``ensure_ray_env``), as requirements.txt pins it for the portal's own.
RAY_VERSION = "2.60.0"
RAY_REQUIREMENT = f"ray[default]=={RAY_VERSION}"
#: The portal's SDK and CLI, installed from source into every environment.
SDK_SOURCE = Path(__file__).resolve().parents[2] / "sdk"
SDK_NAME = "gpuportal"

_REQUIREMENT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._\[\],-]*\s*([<>=!~]=?\s*[A-Za-z0-9.*+!-]+\s*,?\s*)*$")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*")


def requirements_for(packages: list[str]) -> list[str]:
    """The profile's requirements plus JupyterLab (or the Jupyter server) and a kernel; refuses
    anything but plain requirement specifiers (no pip options, URLs or paths). A ``gpuportal``
    entry is dropped: the portal installs its own SDK, the version of its own checkout."""
    wanted: list[str] = []
    for package in packages:
        package = str(package).strip()
        if not package or not _REQUIREMENT_RE.match(package):
            raise PolicyRefusal(f"{package!r} is not a package requirement such as 'pandas' or 'numpy==2.1.0'")
        if _canonical(package) != SDK_NAME:
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


@functools.lru_cache(maxsize=8)
def _python_version(python: str) -> str:
    return subprocess.run(
        [python, "-c", "import sys; print(sys.version)"], capture_output=True, text=True, check=True
    ).stdout.strip()


def sdk_version() -> str:
    """The version of the SDK in this checkout (``gpuportal.__version__``)."""
    match = re.search(r'^__version__ = "([^"]+)"', (SDK_SOURCE / SDK_NAME / "__init__.py").read_text(), re.M)
    if match is None:
        raise BackendError(f"no __version__ in {SDK_SOURCE / SDK_NAME / '__init__.py'}", permanent=True)
    return match.group(1)


def sdk_digest() -> str:
    """A digest of the SDK's sources: an environment is built again whenever they change, so
    that it always holds the SDK of this checkout, even between two releases."""
    digest = hashlib.sha256()
    files = [SDK_SOURCE / "pyproject.toml", *sorted((SDK_SOURCE / SDK_NAME).rglob("*"))]
    for path in files:
        if path.is_file() and "__pycache__" not in path.parts:
            digest.update(f"{path.relative_to(SDK_SOURCE).as_posix()}\0".encode())
            digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()[:16]


def env_digest(requirements: list[str], python: str = sys.executable) -> str:
    """The name of the environment of ``requirements`` (and the SDK of this checkout) for ``python``."""
    blob = json.dumps({"python": _python_version(python), "requirements": sorted(requirements), "sdk": sdk_digest()})
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def env_is_built(packages: list[str], root: Path, python: str = sys.executable) -> bool:
    """Whether ``ensure_env`` would return at once, the environment of ``packages`` being built."""
    return (root / env_digest(requirements_for(packages), python) / ".ready").exists()


def ensure_env(
    packages: list[str], root: Path, python: str = sys.executable, *, steps: StartSteps | None = None, by: str = ""
) -> Path:
    """Return the directory of a virtualenv holding ``packages``, JupyterLab and the portal's SDK,
    building it if it is not there yet. ``BackendError`` (transient) if pip fails, with its last lines.
    What it does is reported to ``steps``; ``by`` says who builds it, to starts that wait for it
    ("the portal" for a build ahead of any start; by default "another start")."""
    requirements = requirements_for(packages)
    build = _Build(f"env:{','.join(requirements)}", requirements, by)
    target = root / env_digest(requirements, python)
    return _ensure(target, python, requirements, system_site_packages=False, build=build, steps=steps)


def sdk_env_dir(root: Path, python: str = sys.executable) -> Path:
    """Where ``ensure_sdk_env`` keeps the SDK's environment for ``python``."""
    return root / f"sdk-{env_digest(['--system-site-packages'], python)}"


def sdk_env_is_built(root: Path, python: str = sys.executable) -> bool:
    """Whether ``ensure_sdk_env`` would return at once, the SDK's environment being built."""
    return (sdk_env_dir(root, python) / ".ready").exists()


def ensure_sdk_env(root: Path, python: str = sys.executable, *, steps: StartSteps | None = None, by: str = "") -> Path:
    """Return the directory of the SDK's own virtualenv, for jobs and instances: the portal's SDK
    and CLI on top of the packages of ``python`` itself (``--system-site-packages``), so that a
    job's ``python`` still sees what the machine has installed. Built once, like ``ensure_env``."""
    build = _Build("sdk", [], by, what="the portal's SDK on this machine's Python")
    return _ensure(sdk_env_dir(root, python), python, [], system_site_packages=True, build=build, steps=steps)


def ensure_ray_env(root: Path, python: str = sys.executable, *, steps: StartSteps | None = None, by: str = "") -> Path:
    """Return the directory of the Ray environment for ``python``: ``ray[default]`` at ``RAY_VERSION``
    and the portal's SDK, where a Ray cluster's nodes run (workers/backends/slurm_ray.py). Built once,
    like ``ensure_env``."""
    target = root / f"ray-{env_digest([RAY_REQUIREMENT], python)}"
    build = _Build("ray", [RAY_REQUIREMENT], by)
    return _ensure(target, python, [RAY_REQUIREMENT], system_site_packages=False, build=build, steps=steps)


# How pip builds llama-cpp-python, which PyPI has as source only: for CPUs, and portable (no
# -march=native: the environment may be shared by machines of different CPUs), without the
# multimodal library and llama.cpp's own programs, which the server does not use. pip keeps the
# wheel it builds in its cache (~/.cache/pip): the next environment with it installs in seconds.
# pip's cache knows the source, not these flags: changing them needs that wheel removed
# (pip cache remove llama_cpp_python), else the wheel built with the old ones is installed.
LLAMACPP_CMAKE_ARGS = (
    "-DGGML_NATIVE=OFF -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF -DLLAVA_BUILD=OFF "
    "-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF"
)


def _serve_env_dir(kind: str, root: Path, python: str) -> tuple[Path, list[str]]:
    if kind not in servers.SERVERS:
        raise PolicyRefusal(f"{kind!r} is not a server kind (one of {', '.join(servers.SERVERS)})")
    requirements = list(servers.SERVERS[kind].requirements)
    # The build flags name the environment too: other flags, another environment.
    digest = env_digest([*requirements, f"CMAKE_ARGS={LLAMACPP_CMAKE_ARGS}"], python)
    return root / f"serve-{kind}-{digest}", requirements


def serve_env_is_built(kind: str, root: Path, python: str = sys.executable) -> bool:
    """Whether ``ensure_serve_env`` would return at once, the environment of ``kind`` being built."""
    return (_serve_env_dir(kind, root, python)[0] / ".ready").exists()


def ensure_serve_env(
    kind: str, root: Path, python: str = sys.executable, *, steps: StartSteps | None = None, by: str = ""
) -> Path:
    """Return the directory of the environment of the model server ``kind`` (``servers.SERVERS``):
    its pinned packages and the portal's SDK, built once like ``ensure_env``. llama-cpp-python is
    compiled on the first build (minutes), with every CPU of this machine."""
    target, requirements = _serve_env_dir(kind, root, python)
    build_env = {"CMAKE_ARGS": LLAMACPP_CMAKE_ARGS, "CMAKE_BUILD_PARALLEL_LEVEL": str(os.cpu_count() or 1)}
    build = _Build(f"serve-{kind}", requirements, by)
    return _ensure(
        target, python, requirements, system_site_packages=False, build_env=build_env, build=build, steps=steps
    )


# JupyterLab's defaults for every user of an environment (its overrides.json): no prompt asking a
# new user whether to fetch Jupyter's news from outside, and no such fetches.
LAB_SETTINGS = {"@jupyterlab/apputils-extension:notification": {"fetchNews": "false", "checkForUpdates": False}}


def _lab_settings(env: Path) -> None:
    settings = env / "share" / "jupyter" / "lab" / "settings" / "overrides.json"
    if not settings.exists():
        settings.parent.mkdir(parents=True, exist_ok=True)
        settings.write_text(json.dumps(LAB_SETTINGS, indent=2) + "\n")
    # Readable by every workspace's account, whatever the umask of the process that wrote it.
    for path in (settings, *settings.parent.relative_to(env).parents, settings.parent.relative_to(env)):
        if path != Path("."):
            (env / path).chmod(0o755 if (env / path).is_dir() else 0o644)


class _Build:
    """What an environment build is, for the steps it reports and the durations it keeps: its
    ``label`` (the same packages, the same label, whatever the SDK's digest), its packages, who
    builds it, and how to say what it holds."""

    def __init__(self, label: str, requirements: list[str], by: str, what: str = "") -> None:
        self.label = label
        self.requirements = requirements
        self.by = by or "another start"
        self.what = what or f"{', '.join(requirements)} and the portal's SDK"


def expected_build_s(root: Path, label: str) -> float | None:
    """The median duration of the earlier builds of ``label`` under ``root`` (None: no earlier build)."""
    durations = _build_records(root).get(label, [])
    return statistics.median(float(entry["seconds"]) for entry in durations) if durations else None


def _build_records(root: Path) -> dict[str, list[dict[str, Any]]]:
    try:
        records = json.loads((root / BUILDS_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return records if isinstance(records, dict) else {}


def _record_build(root: Path, label: str, seconds: float) -> None:
    """Keep how long a build of ``label`` took (the last ``BUILDS_KEPT`` of each label)."""
    with open(root / f"{BUILDS_FILE}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        records = _build_records(root)
        kept = [*records.get(label, []), {"seconds": round(seconds, 2), "at": round(time.time())}]
        records[label] = kept[-BUILDS_KEPT:]
        partial = root / f"{BUILDS_FILE}.tmp"
        partial.write_text(json.dumps(records, indent=1, sort_keys=True) + "\n")
        partial.chmod(0o644)
        os.replace(partial, root / BUILDS_FILE)


def _built_ago(target: Path) -> str:
    try:
        return f"built {describe_duration(time.time() - (target / '.ready').stat().st_mtime)} ago"
    except OSError:
        return "built earlier"


def _usually(expected: float | None) -> str:
    return f"usually {describe_duration(expected)}" if expected is not None else "the first build: none to go by"


def _report_waiting(target: Path, build: _Build, steps: StartSteps | None, expected: float | None) -> None:
    """Another process holds the build's lock: say whose build is waited for, and since when."""
    if steps is None:
        return
    try:
        info = json.loads(target.with_name(f"{target.name}.building.json").read_text())
        since = f"started {describe_duration(time.time() - float(info['started_at']))} ago by {info['by']}"
    except (OSError, ValueError, KeyError, TypeError):
        since = "started by another process"
    steps.begin(
        ENVIRONMENT,
        f"building the Python environment ({build.what}): {since}, {_usually(expected)}",
        expected_s=expected,
        packages=build.requirements,
    )


def _wait_for_lock(lock: Any, target: Path, build: _Build, steps: StartSteps | None, expected: float | None) -> None:
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:  # another worker is building it: wait for it, and say so
        _report_waiting(target, build, steps, expected)
        fcntl.flock(lock, fcntl.LOCK_EX)


def _ensure(
    target: Path,
    python: str,
    requirements: list[str],
    *,
    system_site_packages: bool,
    build_env: dict[str, str] | None = None,
    build: _Build | None = None,
    steps: StartSteps | None = None,
) -> Path:
    build = build or _Build(target.name, requirements, "")
    if (target / ".ready").exists():
        with contextlib.suppress(OSError):  # not ours to change: JupyterLab keeps its defaults
            _lab_settings(target)  # an environment built before it was written
        if steps is not None:
            steps.begin(ENVIRONMENT, f"the Python environment is ready ({build.what}): {_built_ago(target)}")
        return target
    root = target.parent
    root.mkdir(parents=True, exist_ok=True)
    expected = expected_build_s(root, build.label)
    with open(root / f"{target.name}.lock", "w") as lock:
        _wait_for_lock(lock, target, build, steps, expected)
        if (target / ".ready").exists():
            return target
        building = root / f"{target.name}.building"
        info = target.with_name(f"{target.name}.building.json")
        began = time.time()
        info.write_text(json.dumps({"started_at": began, "by": build.by}))
        if steps is not None:
            steps.begin(
                ENVIRONMENT,
                f"building the Python environment ({build.what}): {_usually(expected)}",
                expected_s=expected,
                packages=build.requirements,
            )
        shutil.rmtree(building, ignore_errors=True)
        shutil.rmtree(target, ignore_errors=True)
        try:
            _run([python, "-m", "venv", *(["--system-site-packages"] if system_site_packages else []), str(building)])
            pip = [str(building / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
            # One resolution for the profile's packages and the SDK's, so that they agree.
            _run([*pip, *requirements, str(SDK_SOURCE)], build_env)
            installed = [*requirements, f"{SDK_NAME}=={sdk_version()}"]
            (building / "requirements.txt").write_text("\n".join(installed) + "\n")
            _lab_settings(building)
            _point_scripts_at(building, target)
            _readable_by_all(building)
            (building / ".ready").write_text("")
            building.rename(target)
        except BaseException:
            shutil.rmtree(building, ignore_errors=True)
            raise
        finally:
            info.unlink(missing_ok=True)
        _record_build(root, build.label, time.time() - began)
    return target


def _point_scripts_at(building: Path, target: Path) -> None:
    """pip writes the path of the environment it installs into in its scripts' first lines
    (``gpuportal``, ``jupyter``, ``pip``): make them the path the environment is renamed to."""
    old, new = str(building).encode(), str(target).encode()
    for script in (building / "bin").iterdir():
        if script.is_symlink() or not script.is_file():
            continue
        text = script.read_bytes()
        if old in text:
            script.write_bytes(text.replace(old, new))


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


def _run(argv: list[str], extra_env: dict[str, str] | None = None) -> None:
    env = {**os.environ, **extra_env} if extra_env else None
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, env=env)
    except subprocess.TimeoutExpired as exc:
        raise BackendError(f"building the Python environment timed out: {' '.join(argv[:4])}", permanent=False) from exc
    if done.returncode != 0:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-5:])
        raise BackendError(f"building the Python environment failed: {tail}", permanent=False)
