"""Resource limits of local workloads: a cgroup for each, on cgroup v2 or v1.

Every process of a local workload (a job's replica, an instance, a notebook) runs in a cgroup that
holds it to what it asked for, and the kernel enforces it: past its memory the workload's largest
process is killed (no swap beyond it; the group's OOM-kill count tells the portal so), past its CPU
cores it is throttled (a CFS quota per 100 ms period), past its number of processes and threads
(``pids.max``) ``fork()`` and ``clone()`` fail.

**Where the groups go.** Under ``<base>/gpuportal/<portal>``, ``<portal>`` being a digest of the
portal's run directory, so that portals sharing a machine never share a group:

- cgroup v2 (``cgroup_root`` is a cgroup2 mount whose ``cgroup.controllers`` has memory, cpu and
  pids): ``<base>`` is the mount's root where the portal may write it (as root), else the parent of
  the portal's own cgroup where that was delegated to the portal (systemd: ``Delegate=yes`` and
  ``DelegateSubgroup=portal`` in its unit, which leaves the portal's own processes in a child of the
  delegated cgroup; v2 lets only a cgroup without processes hand controllers down);
- cgroup v1 (a hierarchy per controller, mounted under ``cgroup_root``): ``<base>`` is the portal's
  own cgroup in each of the memory, cpu and pids hierarchies (and cpuacct's, for accounting), so
  that workloads stay inside whatever holds the portal.

**Layout.** A group ``W`` per workload, named after its run directory. A job's replicas each get a
leaf ``W/r<rank>`` holding the replica's limits. An instance's limits are on ``W`` itself, its
holder in the leaf ``W/holder``, and each of its notebooks in a leaf ``W/<notebook>``: notebooks
share their instance's limits. Processes only ever sit in leaves (v2's no-internal-processes rule).

A process joins a group by writing its pid into ``cgroup.procs`` (one file per hierarchy on v1,
see :meth:`Group.procs_files`); its children inherit the group. Run ``python -m
workers.backends.cgroups [ROOT]`` to learn whether limits can be applied on this machine.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

GIB = 1 << 30
CPU_PERIOD_US = 100_000
MIN_CPU_QUOTA_US = 1_000  # the kernel's own minimum
DEFAULT_PIDS_MAX = 4096
#: The controllers every workload's limits need.
REQUIRED = ("memory", "cpu", "pids")
#: v1's CPU accounting, joined where it is mounted (it may share the cpu hierarchy).
ACCOUNTING = "cpuacct"
#: The key of a v2 group's one directory in :attr:`Group.dirs`.
UNIFIED = "unified"
PARENT = "gpuportal"
HOLDER = "holder"
#: Files written only where they exist: swap accounting may be off.
_OPTIONAL = ("memory.swap.max", "memory.memsw.limit_in_bytes")


class Unavailable(Exception):
    """Limits cannot be applied on this machine; the message says why."""


@dataclass(frozen=True)
class Limits:
    """What one group holds its processes to: CPU cores, memory (GB read as GiB), processes."""

    cpu_cores: float
    memory_gb: float
    pids_max: int = DEFAULT_PIDS_MAX

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gb * GIB)

    @property
    def cpu_quota_us(self) -> int:
        return max(MIN_CPU_QUOTA_US, int(self.cpu_cores * CPU_PERIOD_US))

    def memory_text(self) -> str:
        """The memory limit as the portal shows it: ``4 GiB``."""
        return f"{self.memory_gb:g} GiB"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Limits:
        return cls(float(data["cpu_cores"]), float(data["memory_gb"]), int(data["pids_max"]))


def limit_files(version: int, limits: Limits) -> dict[str, list[tuple[str, str]]]:
    """What to write, in order, into each of a group's directories (keyed as :attr:`Group.dirs`).

    v1 lifts ``memory.memsw.limit_in_bytes`` first (it may never be below the memory limit, so a
    group being given a higher limit than it had would refuse the memory limit otherwise), then sets
    it to the memory limit: no swap beyond it. The swap files are skipped where swap accounting is off.
    """
    memory, quota, pids = str(limits.memory_bytes), str(limits.cpu_quota_us), str(limits.pids_max)
    if version == 2:
        return {
            UNIFIED: [
                ("cpu.max", f"{quota} {CPU_PERIOD_US}"),
                ("memory.max", memory),
                ("memory.swap.max", "0"),
                ("pids.max", pids),
            ]
        }
    return {
        "memory": [
            ("memory.memsw.limit_in_bytes", "-1"),
            ("memory.limit_in_bytes", memory),
            ("memory.memsw.limit_in_bytes", memory),
        ],
        "cpu": [("cpu.cfs_period_us", str(CPU_PERIOD_US)), ("cpu.cfs_quota_us", quota)],
        "pids": [("pids.max", pids)],
    }


@dataclass(frozen=True)
class Group:
    """One cgroup: its directory in each hierarchy (v2: one, keyed ``unified``; v1: one per controller)."""

    version: int
    dirs: dict[str, str]

    def child(self, name: str) -> Group:
        if not name or "/" in name or name in (".", ".."):
            raise ValueError(f"{name!r} is not a cgroup name")
        return Group(self.version, {key: os.path.join(path, name) for key, path in self.dirs.items()})

    def directories(self) -> list[str]:
        """Its distinct directories (v1 controllers mounted together share one)."""
        return sorted(set(self.dirs.values()))

    def procs_files(self) -> list[str]:
        """The files a process writes its pid into to join the group, one per hierarchy."""
        return [os.path.join(path, "cgroup.procs") for path in self.directories()]

    def exists(self) -> bool:
        return all(os.path.isdir(path) for path in self.dirs.values())

    def to_json(self) -> dict[str, Any]:
        return {"version": self.version, "dirs": dict(self.dirs)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Group:
        return cls(int(data["version"]), {str(k): str(v) for k, v in data["dirs"].items()})


@dataclass(frozen=True)
class Hierarchy:
    """Where this portal's groups go: ``root`` is ``<base>/gpuportal/<portal>`` (see the module)."""

    version: int
    root: Group

    def group(self, name: str) -> Group:
        return self.root.child(name)

    def holds(self, group: Group) -> bool:
        """Whether ``group`` lies under this portal's root in every hierarchy (a recorded group is
        only reused or written to where it does)."""
        if group.version != self.version or set(group.dirs) != set(self.root.dirs):
            return False
        return all(Path(os.path.normpath(path)).is_relative_to(self.root.dirs[key]) for key, path in group.dirs.items())


# -- finding the hierarchy ---------------------------------------------------------------------


@dataclass(frozen=True)
class _Mount:
    root: str  # the hierarchy's path that is mounted here (not "/" for a bind of a subtree)
    point: str
    fstype: str
    options: frozenset[str]


def _unescape(field: str) -> str:
    """A path of /proc/self/mountinfo, whose spaces, tabs, newlines and backslashes are octal escapes."""
    for code in ("040", "011", "012", "134"):
        field = field.replace("\\" + code, chr(int(code, 8)))
    return field


def parse_mountinfo(text: str) -> list[_Mount]:
    """The cgroup and cgroup2 mounts of ``/proc/self/mountinfo``."""
    mounts = []
    for line in text.splitlines():
        fields = line.split()
        if " - " not in line or len(fields) < 5:
            continue
        after = line.split(" - ", 1)[1].split()
        if len(after) < 3 or after[0] not in ("cgroup", "cgroup2"):
            continue
        options = frozenset(after[2].split(","))
        mounts.append(_Mount(_unescape(fields[3]), _unescape(fields[4]), after[0], options))
    return mounts


def parse_own_cgroups(text: str) -> dict[str, str]:
    """The portal's own cgroup per controller (``unified`` for v2) from ``/proc/self/cgroup``."""
    own = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        for controller in controllers.split(",") if controllers else [UNIFIED]:
            own[controller] = path
    return own


def _inside(mount: _Mount, own_path: str) -> str:
    """The directory of the portal's own cgroup under ``mount``, or the mount point where the
    portal's cgroup is not in the part of the hierarchy mounted there."""
    relative = os.path.relpath(own_path, mount.root) if own_path else "."
    if relative == ".." or relative.startswith("../"):
        return mount.point
    return os.path.normpath(os.path.join(mount.point, relative))


def _writable(directory: str, control: str) -> bool:
    return os.access(directory, os.W_OK) and os.access(os.path.join(directory, control), os.W_OK)


def _read_words(path: str) -> set[str]:
    try:
        return set(Path(path).read_text().split())
    except OSError:
        return set()


def detect(cgroup_root: str, portal: str, *, mountinfo: str | None = None, own: str | None = None) -> Hierarchy:
    """The hierarchy this portal's groups go in (nothing is written), or ``Unavailable`` saying why.

    ``portal`` names this portal's groups; ``mountinfo`` and ``own`` are the texts of
    ``/proc/self/mountinfo`` and ``/proc/self/cgroup`` (read when not given)."""
    root = os.path.normpath(cgroup_root)
    mounts = parse_mountinfo(mountinfo if mountinfo is not None else Path("/proc/self/mountinfo").read_text())
    owned = parse_own_cgroups(own if own is not None else Path("/proc/self/cgroup").read_text())
    unified = [m for m in mounts if m.fstype == "cgroup2" and m.point == root]
    if unified:
        base = _v2_base(unified[-1], owned.get(UNIFIED, "/"))
        hierarchy = Hierarchy(2, Group(2, {UNIFIED: os.path.join(base, PARENT, portal)}))
    else:
        v1 = [m for m in mounts if m.fstype == "cgroup" and m.point.startswith(root + "/")]
        hierarchy = Hierarchy(
            1, Group(1, {k: os.path.join(b, PARENT, portal) for k, b in _v1_bases(v1, owned, root).items()})
        )
    if any(":" in path for path in hierarchy.root.dirs.values()):  # the wrapper's list of groups is ":"-separated
        raise Unavailable(f"a cgroup path holds a colon, which the portal cannot use: {hierarchy.root.directories()}")
    return hierarchy


def _v2_base(mount: _Mount, own_path: str) -> str:
    missing = [c for c in REQUIRED if c not in _read_words(os.path.join(mount.point, "cgroup.controllers"))]
    if missing:
        raise Unavailable(
            f"the cgroup2 hierarchy at {mount.point} has no {', '.join(missing)} controller (it is bound to "
            "cgroup v1, or not enabled)"
        )
    if _writable(mount.point, "cgroup.subtree_control"):
        return mount.point
    parent = os.path.dirname(_inside(mount, own_path))  # delegated: the portal's processes are in a child
    delegated = parent.startswith(mount.point + "/") and _writable(parent, "cgroup.subtree_control")
    if delegated and set(REQUIRED) <= _read_words(os.path.join(parent, "cgroup.controllers")):
        return parent
    raise Unavailable(
        f"the portal may not create cgroups in {mount.point} (it is read-only, or the portal is not root) "
        "and was delegated none: run the portal as root, or give it a delegated cgroup with the memory, cpu "
        "and pids controllers (systemd: Delegate=yes and DelegateSubgroup=portal in its unit)"
    )


def _v1_bases(mounts: list[_Mount], owned: dict[str, str], root: str) -> dict[str, str]:
    bases: dict[str, str] = {}
    for controller in (*REQUIRED, ACCOUNTING):
        mount = next((m for m in mounts if controller in m.options), None)
        if mount is None:
            if controller == ACCOUNTING:
                continue
            raise Unavailable(
                f"{root} has neither a cgroup2 hierarchy with the memory, cpu and pids controllers nor a "
                f"cgroup v1 {controller} hierarchy mounted under it"
            )
        base = _inside(mount, owned.get(controller, "/"))
        if not _writable(base, "cgroup.procs"):
            raise Unavailable(
                f"the portal may not create cgroups in {base} (it is read-only, or the portal is not root): "
                "run the portal as root"
            )
        bases[controller] = base
    if not os.path.exists(os.path.join(bases["cpu"], "cpu.cfs_quota_us")):
        raise Unavailable(f"the cpu controller at {bases['cpu']} has no CFS quota (CONFIG_CFS_BANDWIDTH)")
    return bases


def open_hierarchy(cgroup_root: str, portal: str) -> Hierarchy:
    """:func:`detect`, then make this portal's root group (and, on v2, hand it the controllers).
    ``Unavailable`` where either fails."""
    hierarchy = detect(cgroup_root, portal)
    try:
        for path in hierarchy.root.directories():
            for directory in (Path(path).parent, Path(path)):
                if hierarchy.version == 2:
                    enable_controllers(directory.parent)
                directory.mkdir(exist_ok=True)
            if hierarchy.version == 2:
                enable_controllers(Path(path))
    except FileNotFoundError:
        raise  # removed meanwhile (see prune()): the caller tries again
    except OSError as exc:
        hint = ""
        if exc.errno == errno.EBUSY:  # v2 lets only a group without processes of its own hand controllers down
            hint = (
                ": processes run in that group itself; move them into a child group, or give the portal a "
                "delegated one (systemd: Delegate=yes and DelegateSubgroup=portal)"
            )
        raise Unavailable(f"could not prepare the portal's cgroup: {exc}{hint}") from exc
    return hierarchy


def prune(root: Group) -> None:
    """Remove this portal's root group once no workload's group is left in it. A start that made
    it and finds it gone (``FileNotFoundError``) opens the hierarchy again."""
    for directory in root.directories():
        with contextlib.suppress(OSError):
            os.rmdir(directory)


def enable_controllers(directory: Path) -> None:
    """Hand the memory, cpu and pids controllers to a v2 group's children (where not done yet)."""
    control = directory / "cgroup.subtree_control"
    if not set(REQUIRED) <= _read_words(str(control)):
        write(control, " ".join(f"+{c}" for c in REQUIRED))


# -- making groups -----------------------------------------------------------------------------


def create(group: Group, limits: Limits | None = None, *, with_children: bool = False) -> None:
    """Make ``group`` (its parent exists) and write ``limits`` into it; ``with_children``: it will
    hold groups rather than processes (v2 hands them the controllers). ``OSError`` naming the file."""
    for directory in group.directories():
        Path(directory).mkdir(exist_ok=True)
    if limits is not None:
        for key, files in limit_files(group.version, limits).items():
            for name, value in files:
                control = Path(group.dirs[key], name)
                if name in _OPTIONAL and not control.exists():
                    continue
                write(control, value)
    if with_children and group.version == 2:
        enable_controllers(Path(group.dirs[UNIFIED]))


def make_workload(
    hierarchy: Hierarchy, name: str, limits: Limits, *, kind: str, replicas: int = 1, instance: Group | None = None
) -> tuple[Group, list[Group]]:
    """A workload's group and the leaves its replicas join (see the module's layout): a notebook's in
    ``instance`` (its instance's group) where given, an instance's, or a job's. ``OSError`` naming
    the file that failed, with what was made of it removed."""
    group = instance.child(name) if instance is not None else hierarchy.group(name)
    try:
        if instance is not None:
            return group, [notebook_group(instance, name)]
        if kind == "instance":
            return instance_groups(hierarchy, name, limits)
        return job_groups(hierarchy, name, limits, replicas)
    except OSError:
        remove(group)
        raise


def job_groups(hierarchy: Hierarchy, name: str, limits: Limits, replicas: int) -> tuple[Group, list[Group]]:
    """A job's group and its replicas' leaves, each with ``limits`` (they are per replica)."""
    workload = hierarchy.group(name)
    create(workload, with_children=True)
    leaves = [workload.child(f"r{rank}") for rank in range(replicas)]
    for leaf in leaves:
        create(leaf, limits)
    return workload, leaves


def instance_groups(hierarchy: Hierarchy, name: str, limits: Limits) -> tuple[Group, list[Group]]:
    """An instance's group, with its limits (its notebooks' too), and its holder's leaf."""
    workload = hierarchy.group(name)
    create(workload, limits, with_children=True)
    holder = workload.child(HOLDER)
    create(holder)
    return workload, [holder]


def notebook_group(instance: Group, name: str) -> Group:
    """A notebook's leaf in its instance's group: bound by the instance's limits."""
    leaf = instance.child(name)
    create(leaf)
    return leaf


# -- reading and removing ----------------------------------------------------------------------


def oom_kills(group: Group) -> int:
    """How many processes the kernel killed in ``group`` for going past its memory (v1
    ``memory.oom_control``, v2 ``memory.events``: ``oom_kill``); 0 where unreadable."""
    name = "memory.events" if group.version == 2 else "memory.oom_control"
    try:
        text = Path(group.dirs[UNIFIED if group.version == 2 else "memory"], name).read_text()
    except (OSError, KeyError):
        return 0
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill":
            return int(value)
    return 0


def cpu_usage_s(group: Group) -> float | None:
    """CPU time the group's processes used, in seconds (v2 ``cpu.stat``, v1 ``cpuacct.usage``),
    ``None`` where it is not accounted."""
    try:
        if group.version == 2:
            for line in Path(group.dirs[UNIFIED], "cpu.stat").read_text().splitlines():
                if line.startswith("usage_usec "):
                    return int(line.split()[1]) / 1e6
            return None
        return int(Path(group.dirs[ACCOUNTING], "cpuacct.usage").read_text()) / 1e9
    except (OSError, KeyError, ValueError):
        return None


def members(group: Group) -> list[int]:
    """The pids in ``group`` and the groups under it."""
    pids: set[int] = set()
    for top in group.directories():
        for directory in _bottom_up(Path(top)):
            pids |= _procs(directory)
    return sorted(pids)


def remove(group: Group, *, timeout_s: float = 5.0) -> list[str]:
    """Kill every process left in ``group`` and the groups under it, then remove them all, deepest
    first. Returns the directories that could not be removed (none when all went)."""
    if not all(PARENT in Path(path).parts[:-1] for path in group.dirs.values()):
        raise ValueError(f"not a group of the portal's: {group.dirs}")
    deadline = time.monotonic() + timeout_s
    return [str(d) for top in group.directories() for d in _bottom_up(Path(top)) if not _rmdir(d, deadline)]


def _rmdir(directory: Path, deadline: float) -> bool:
    """Empty and remove one group; a process killed a moment ago keeps it busy until it has exited."""
    while True:
        _empty(directory, deadline)
        try:
            directory.rmdir()
            return True
        except FileNotFoundError:
            return True
        except OSError as exc:
            if exc.errno != errno.EBUSY or time.monotonic() >= deadline:
                return False
        time.sleep(0.02)


def _bottom_up(top: Path) -> list[Path]:
    if not top.is_dir():
        return []
    found = []
    for parent, subdirs, _ in os.walk(top, topdown=False):
        found += [Path(parent, sub) for sub in subdirs]
    return [*found, top]


def _procs(directory: Path) -> set[int]:
    try:
        return {int(pid) for pid in (directory / "cgroup.procs").read_text().split()}
    except (OSError, ValueError):
        return set()


def _empty(directory: Path, deadline: float) -> None:
    """SIGKILL what runs in ``directory`` (v2's ``cgroup.kill`` at once where the kernel has it)
    until it is empty or the deadline passes."""
    kill_file = directory / "cgroup.kill"
    while pids := _procs(directory):
        if kill_file.exists():
            with contextlib.suppress(OSError):
                kill_file.write_text("1")
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        if time.monotonic() >= deadline:
            return
        time.sleep(0.02)


def write(path: Path, value: str) -> None:
    """Write a control file; a failed write names the file (the kernel's error does not)."""
    try:
        path.write_text(value)
    except OSError as exc:
        raise OSError(exc.errno or errno.EIO, f"writing {value!r} to {path}: {exc.strerror}") from exc


def main(argv: list[str]) -> int:
    """Say whether limits can be applied here: exit 0 and where, or 1 and why not (deploy/run.sh)."""
    root = argv[1] if len(argv) > 1 else "/sys/fs/cgroup"
    try:
        hierarchy = detect(root, "check")
    except (Unavailable, OSError) as exc:
        print(exc)
        return 1
    where = ", ".join(str(Path(path).parent.parent) for path in hierarchy.root.directories())
    print(f"cgroup v{hierarchy.version}: workloads' groups go under {where}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
