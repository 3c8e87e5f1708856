"""Each workspace's directory on this machine as a filesystem of its own, the size of its disk quota.

A workspace's directory (under the portal's work directory) is a sparse ext4 image, kept in the
portal's private image directory, loop-mounted on it with ``nosuid,nodev``: a workload that writes
past the quota gets ``ENOSPC``, and the machine's own filesystem, the portal's data and the other
workspaces' files never fill up. The image is made (``mkfs.ext4``, no blocks reserved for root) on
the workspace's first workload, and mounted before every start where it is not (after a reboot, say):
mounting is idempotent. A larger quota grows the image and its filesystem online (``resize2fs`` on
the mounted loop device); a smaller one waits until nothing uses the filesystem (the portal asks once
no workload of the workspace runs, or it happens at the next mount), and is made only where the
files fit: the filesystem then keeps its size and says why.

Nothing here imports Django: the portal hands a :class:`~workers.backends.base.DiskQuota` to the
backend on each workload's spec, and keeps the disks up from its scheduler loop. Mounting needs root:
elsewhere every call refuses with a message (``BackendError``, permanent), and the operator may opt
out (``PORTAL_DISK_QUOTA=off``). Every command runs through :func:`_run`; a lock file beside each
image keeps the portal's processes from changing one image at the same time.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import stat
import subprocess
import tempfile
import time
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

from workers.backends.base import BackendError, DiskQuota

GIB = 1 << 30
# Options of every workspace's filesystem: no set-user-id programs, no device nodes.
MOUNT_OPTIONS = "nosuid,nodev"
# mke2fs: no blocks reserved for root (the quota is the workspace's, all of it); inode tables and
# journal left to read as zeros, which a new sparse image does: making one writes a few MiB.
MKFS_OPTIONS = ("-q", "-F", "-m", "0", "-E", "lazy_itable_init=1,lazy_journal_init=1")
TOOLS = ("mkfs.ext4", "e2fsck", "resize2fs", "mount", "umount", "losetup", "cp")
SBIN_PATH = "/usr/sbin:/sbin:/usr/bin:/bin"
COMMAND_TIMEOUT_S = 600.0
# What the largest top-level directories' sizes may cost each time a disk is measured.
MEASURE_BUDGET_S = 5.0
LARGEST_SHOWN = 8
_SKIPPED = {"lost+found"}  # the filesystem's own, empty unless e2fsck put something there


@dataclass(frozen=True)
class DiskUsage:
    """What a workspace's filesystem holds: its size, what is used and free (statvfs), and the
    largest of its top-level entries (name, bytes on disk), largest first. ``complete`` is false
    where walking them ran out of time: their sizes are then at least what is shown."""

    size_bytes: int
    used_bytes: int
    free_bytes: int
    largest: list[tuple[str, int]] = field(default_factory=list)
    complete: bool = True


@dataclass(frozen=True)
class _Mount:
    device: str
    mountpoint: str


# -- what the portal calls ---------------------------------------------------------------------


def check_can_mount() -> None:
    """``BackendError(permanent=True)``, saying what to do, where this portal cannot mount disks."""
    if not _is_root():
        raise BackendError(
            "workspace disk quotas need the portal to run as root (it runs as uid "
            f"{os.geteuid()}): a workspace's directory is a disk image the portal mounts. Run the "
            "portal as root, or set PORTAL_DISK_QUOTA=off to let workloads write without a limit "
            "(a single-user workstation only)",
            permanent=True,
        )
    missing = [tool for tool in TOOLS if _which(tool) is None]
    if missing:
        raise BackendError(
            f"{', '.join(missing)} not found: workspace disk quotas need e2fsprogs and util-linux "
            "(apt-get install e2fsprogs mount), or set PORTAL_DISK_QUOTA=off to run without them",
            permanent=True,
        )


def probe() -> str:
    """Why this portal could not give workspaces their disks ("" where it can): a small image is
    made, mounted and removed for real, so that a machine without loop devices (a container) shows."""
    if not _is_root():
        return f"mounting a workspace's disk needs root, and this runs as uid {os.geteuid()}"
    try:
        check_can_mount()
        with tempfile.TemporaryDirectory(prefix="gpuportal-disk-probe-") as scratch:
            image, mountpoint = Path(scratch) / "probe.img", Path(scratch) / "mnt"
            _make_image(image, 16 << 20)
            _prepare_mountpoint(mountpoint)
            options = f"loop,{MOUNT_OPTIONS}"
            _run(["mount", "-t", "ext4", "-o", options, str(image), str(mountpoint)], what="mounting a test disk")
            _run(["umount", str(mountpoint)], what="unmounting a test disk")
    except BackendError as exc:
        return exc.message
    return ""


def ensure_mounted(disk: DiskQuota) -> str:
    """Before a workload starts: the workspace's image mounted on its directory, made first if it
    has none (files already in the directory are moved into it), grown to the quota if smaller.

    Nothing to do where it is mounted and large enough. Returns a note for the workspace's page
    ("" if none): a smaller quota waits for the filesystem to be unmounted, or for its files to fit.
    ``BackendError(permanent=True)`` where it cannot be done (not root, a tool missing, something
    else mounted there, the files in the directory do not fit); transient where processes started
    before the workspace had a quota still use the directory."""
    check_can_mount()
    image, directory = _paths(disk)
    with _locked(image):
        current = _mount_at(directory)
        if current is None:
            return _mount_image(image, directory, disk.size_bytes)
        _check_ours(current, image, directory)
        return _resize_online(image, current.device, disk.size_bytes)


def apply_quota(disk: DiskQuota, *, idle: bool) -> str:
    """Bring a workspace's existing disk to its quota (the scheduler loop's upkeep): mounted again
    where it is not (after a reboot), grown online, or, where that cannot be done and ``idle`` (no
    workload of the workspace runs), unmounted, resized (shrunk only where its files fit) and
    mounted again. A workspace without an image yet is left alone: it gets one with its first
    workload. Returns a note as ``ensure_mounted()``."""
    check_can_mount()
    image, directory = _paths(disk)
    size = disk.size_bytes
    with _locked(image):
        if not image.exists():
            return ""
        current = _mount_at(directory)
        if current is None:
            return _mount_image(image, directory, size)
        _check_ours(current, image, directory)
        note = _resize_online(image, current.device, size)
        if not note or not idle:
            return note
        if size < image.stat().st_size and _smallest(current.device, directory) > size:
            return f"stays {_gib(image.stat().st_size)}: its files do not fit in {_gib(size)}"
        # Nothing of the workspace runs: unmounted, resized as a file, and mounted again.
        _run(["umount", str(directory)], what=f"unmounting {directory} to resize it", permanent=False)
        return _mount_image(image, directory, size)


def release(image: str) -> None:
    """Unmount a deleted workspace's image wherever it is mounted, and remove it (its files go)."""
    path = Path(os.path.realpath(image))
    with _locked(path):
        for mount in _mounts():
            if _backing_file(mount.device) == str(path):
                _run(["umount", mount.mountpoint], what=f"unmounting {mount.mountpoint}", permanent=False)
        path.unlink(missing_ok=True)
    Path(f"{path}.lock").unlink(missing_ok=True)


def unmount_under(root: str, *, lazy: bool = False) -> list[str]:
    """Unmount every disk image mounted below ``root`` (the portal's work directory), deepest first:
    once nothing of the portal runs (the embedded portal's stop). Returns what stayed mounted."""
    prefix = os.path.realpath(root).rstrip("/") + "/"
    points = {m.mountpoint for m in _mounts() if m.mountpoint.startswith(prefix) and _is_loop(m.device)}
    stayed = []
    for point in sorted(points, key=len, reverse=True):
        try:
            _run(["umount", *(["-l"] if lazy else []), point], what=f"unmounting {point}", permanent=False)
        except BackendError:
            stayed.append(point)
    return stayed


def mounted_from(image_dir: str) -> list[str]:
    """Where the images in ``image_dir`` are mounted in this namespace, deepest first."""
    prefix = os.path.realpath(image_dir).rstrip("/") + "/"
    points = {m.mountpoint for m in _mounts() if (_backing_file(m.device) or "").startswith(prefix)}
    return sorted(points, key=len, reverse=True)


def is_mounted(disk: DiskQuota) -> bool:
    """Whether the workspace's own image is what is mounted on its directory."""
    image, directory = _paths(disk)
    current = _mount_at(directory)
    return current is not None and _backing_file(current.device) == str(image)


def measure(directory: str, *, budget_s: float = MEASURE_BUDGET_S, shown: int = LARGEST_SHOWN) -> DiskUsage:
    """The filesystem mounted on ``directory``: size, used and free, and its largest top-level
    entries, walked without following links for at most ``budget_s`` seconds in all."""
    info = os.statvfs(directory)
    deadline = time.monotonic() + budget_s
    sizes: list[tuple[str, int]] = []
    complete = True
    root = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        seen: set[tuple[int, int]] = set()
        for name in sorted(os.listdir(root)):
            if name in _SKIPPED:
                continue
            size, done = _size_of(root, name, deadline, seen)
            sizes.append((name, size))
            complete = complete and done
    finally:
        os.close(root)
    sizes.sort(key=lambda item: (-item[1], item[0]))
    return DiskUsage(
        size_bytes=info.f_blocks * info.f_frsize,
        used_bytes=(info.f_blocks - info.f_bfree) * info.f_frsize,
        free_bytes=info.f_bavail * info.f_frsize,
        largest=sizes[:shown],
        complete=complete,
    )


# -- making, mounting, resizing ----------------------------------------------------------------


def _paths(disk: DiskQuota) -> tuple[Path, Path]:
    # The kernel names a loop device's file by its real path: compare with that.
    return Path(os.path.realpath(disk.image)), Path(os.path.abspath(disk.directory))


def _mount_image(image: Path, directory: Path, size: int) -> str:
    """Mount ``image`` (made if missing, resized offline where nothing uses it) on ``directory``,
    which keeps its owner and mode."""
    _prepare_mountpoint(directory)
    _wait_detached(image)  # an image just unmounted may still be on its way off its loop device
    devices = _attached(image)
    if len(devices) > 1:
        raise BackendError(f"the disk image {image} is attached to {', '.join(devices)} at once", permanent=True)
    made = not image.exists()
    if made:
        _make_image(image, size)
    note = "" if made or devices else _fit_offline(image, size)
    if _holds_files(directory):
        if not made:
            raise BackendError(
                f"{directory} holds files outside its disk image {image}: move them into the mounted "
                "image or away, then start again",
                permanent=True,
            )
        _move_in(image, directory, size)
    owner = os.lstat(directory)
    source = devices[0] if devices else str(image)
    options = MOUNT_OPTIONS if devices else f"loop,{MOUNT_OPTIONS}"
    _run(["mount", "-t", "ext4", "-o", options, source, str(directory)], what=f"mounting {image} on {directory}")
    os.chown(directory, owner.st_uid, owner.st_gid, follow_symlinks=False)
    os.chmod(directory, stat.S_IMODE(owner.st_mode), follow_symlinks=False)
    if devices:  # still attached where a sandbox holds it: grown online, shrunk once released
        return _resize_online(image, devices[0], size)
    return note


def _prepare_mountpoint(directory: Path) -> None:
    try:
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        info = os.lstat(directory)
    except OSError as exc:
        raise BackendError(f"could not create the directory {directory}: {exc.strerror}", permanent=True) from exc
    if not stat.S_ISDIR(info.st_mode):
        raise BackendError(f"{directory} is not a directory (a link or a file is in its place)", permanent=True)


def _make_image(image: Path, size: int) -> None:
    """A sparse file of ``size`` bytes holding an empty ext4 filesystem, in place at once or not at all."""
    image.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    partial = image.with_name(f"{image.name}.new")
    partial.unlink(missing_ok=True)
    try:
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            os.ftruncate(fd, size)
        finally:
            os.close(fd)
        _run(["mkfs.ext4", *MKFS_OPTIONS, str(partial)], what=f"making the disk image {image}")
        os.replace(partial, image)
    except OSError as exc:
        raise BackendError(f"could not make the disk image {image}: {exc.strerror}", permanent=True) from exc
    finally:
        partial.unlink(missing_ok=True)


def _fit_offline(image: Path, size: int) -> str:
    """Resize an image nothing has attached: grown at once; shrunk only where its files fit."""
    have = image.stat().st_size
    if have == size:
        return ""
    _run(["e2fsck", "-f", "-p", str(image)], what=f"checking {image} before resizing it", ok=(0, 1, 2))
    if size > have:
        os.truncate(image, size)
        _run(["resize2fs", str(image)], what=f"growing {image}")
        return ""
    try:
        _run(["resize2fs", str(image), f"{size // 1024}K"], what=f"shrinking {image}")
    except BackendError as exc:
        return f"stays {_gib(have)}: its files do not fit in {_gib(size)} ({exc.message.splitlines()[-1][-200:]})"
    os.truncate(image, size)
    return ""


def _resize_online(image: Path, device: str, size: int) -> str:
    """Grow a mounted image and its filesystem to ``size``. A smaller size waits until nothing uses
    it, and so does a larger one where the kernel refuses to grow a mounted filesystem (without
    ``CAP_SYS_RESOURCE``, in some containers): a note says so."""
    have = image.stat().st_size
    if size < have:
        return f"stays {_gib(have)} until no workload uses it, then shrinks to {_gib(size)} if its files fit"
    if size == have:
        return ""
    os.truncate(image, size)
    try:
        _run(["losetup", "--set-capacity", device], what=f"growing {device}")
        _run(["resize2fs", device], what=f"growing the filesystem on {device}")
    except BackendError as exc:
        # The filesystem kept its size: so does its image (nothing was written past it).
        os.truncate(image, have)
        with contextlib.suppress(BackendError):
            _run(["losetup", "--set-capacity", device], what=f"restoring the size of {device}")
        reason = exc.message.splitlines()[-1][-200:]
        return f"stays {_gib(have)} until no workload uses it, then grows to {_gib(size)} ({reason})"
    return ""


def _smallest(device: str, directory: Path) -> int:
    """The smallest size the mounted filesystem could be shrunk to (resize2fs's estimate), in bytes."""
    done = _run(["resize2fs", "-P", device], what=f"estimating how small {device} can be")
    blocks = next((line.rsplit(":", 1)[1] for line in done.stdout.splitlines() if "minimum size" in line), "")
    return int(blocks.strip() or 0) * os.statvfs(directory).f_frsize


def _move_in(image: Path, directory: Path, size: int) -> None:
    """Copy what a directory held before its workspace had a quota into its new image (mounted
    aside), then remove it there; where it does not fit, the image goes and the files stay."""
    users = _users_of(directory)
    if users:
        raise BackendError(
            f"processes started before the workspace had a disk quota still use {directory} "
            f"(pids {', '.join(map(str, users[:10]))}): it gets its quota once they end",
            permanent=False,
        )
    staging = Path(tempfile.mkdtemp(prefix="gpuportal-disk-"))
    try:
        _run(["mount", "-t", "ext4", "-o", f"loop,{MOUNT_OPTIONS}", str(image), str(staging)], what="mounting aside")
        try:
            copied = _run(["cp", "-a", "--", f"{directory}/.", f"{staging}/"], what="copying", ok=None)
        finally:
            _run(["umount", str(staging)], what=f"unmounting {staging}", permanent=False)
    finally:
        staging.rmdir()
    if copied.returncode != 0:
        image.unlink()
        raise BackendError(
            f"the files already in {directory} do not fit its disk quota of {_gib(size)} "
            f"({copied.stderr.strip()[-300:]}): raise the quota, or move files out",
            permanent=True,
        )
    with os.scandir(directory) as entries:
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path)
            else:
                os.unlink(entry.path)


def _holds_files(directory: Path) -> bool:
    with os.scandir(directory) as entries:
        return any(True for _ in entries)


# -- the kernel's view: mounts, loop devices, processes ----------------------------------------


def _mounts() -> list[_Mount]:
    """This mount namespace's mounts, in mount order (``/proc/self/mountinfo``)."""
    mounts = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        if " - " not in line or len(fields) < 5:
            continue
        after = line.split(" - ", 1)[1].split()
        if len(after) >= 2:
            mounts.append(_Mount(device=_unescape(after[1]), mountpoint=_unescape(fields[4])))
    return mounts


def _unescape(text: str) -> str:
    """mountinfo writes a space, tab, newline and backslash in octal (``\\040``)."""
    for code in ("040", "011", "012", "134"):
        text = text.replace(f"\\{code}", chr(int(code, 8)))
    return text


def _mount_at(directory: Path) -> _Mount | None:
    """What is mounted on ``directory`` (the topmost of a stack), if anything."""
    real = os.path.realpath(directory)
    found = [m for m in _mounts() if m.mountpoint == real]
    return found[-1] if found else None


def _is_loop(device: str) -> bool:
    return device.startswith("/dev/loop") and device[len("/dev/loop") :].isdigit()


def _backing_file(device: str) -> str | None:
    """The file a loop device reads, as the kernel names it (its real path)."""
    if not _is_loop(device):
        return None
    try:
        return Path(f"/sys/block/{os.path.basename(device)}/loop/backing_file").read_text().strip()
    except OSError:
        return None


def _attached(image: Path) -> list[str]:
    """The loop devices ``image`` is attached to: mounted here, or in a sandbox's namespace."""
    devices = []
    for backing in Path("/sys/block").glob("loop*/loop/backing_file"):
        with contextlib.suppress(OSError):
            if backing.read_text().strip() == str(image):
                devices.append(f"/dev/{backing.parent.parent.name}")
    return sorted(devices)


def _wait_detached(image: Path, timeout_s: float = 2.0) -> None:
    """Give the kernel a moment to free an unmounted image's loop device (it may do so a little
    later); one still attached after that is in use elsewhere, and ``_mount_image()`` reuses it."""
    deadline = time.monotonic() + timeout_s
    while _attached(image) and time.monotonic() < deadline:
        time.sleep(0.02)


def _check_ours(mount: _Mount, image: Path, directory: Path) -> None:
    backing = _backing_file(mount.device)
    if backing != str(image):
        raise BackendError(
            f"{directory} has {mount.device} ({backing or 'not a disk image'}) mounted on it, not the "
            f"workspace's disk image {image}",
            permanent=True,
        )


def _users_of(directory: Path) -> list[int]:
    """Processes whose working directory, root or an open file lies in ``directory``."""
    prefix = str(directory).rstrip("/") + "/"
    users = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        links = [f"/proc/{entry}/cwd", f"/proc/{entry}/root"]
        with contextlib.suppress(OSError):
            links += [f"/proc/{entry}/fd/{fd}" for fd in os.listdir(f"/proc/{entry}/fd")]
        for link in links:
            with contextlib.suppress(OSError):
                target = os.readlink(link)
                if target == str(directory) or target.startswith(prefix):
                    users.append(int(entry))
                    break
    return users


def _size_of(root: int, name: str, deadline: float, seen: set[tuple[int, int]]) -> tuple[int, bool]:
    """Bytes on disk of ``name`` in the directory ``root`` (recursively, never through a link), and
    whether the walk finished before ``deadline``. A file with several links counts once."""
    try:
        info = os.stat(name, dir_fd=root, follow_symlinks=False)
    except OSError:
        return 0, True
    total = info.st_blocks * 512
    if not stat.S_ISDIR(info.st_mode):
        return total, True
    walk = cast(Generator[tuple[str, list[str], list[str], int]], os.fwalk(name, dir_fd=root, follow_symlinks=False))
    with contextlib.closing(walk):  # its directories' descriptors are closed when it stops early
        for _, dirs, files, fd in walk:
            for entry in (*dirs, *files):
                with contextlib.suppress(OSError):
                    inner = os.stat(entry, dir_fd=fd, follow_symlinks=False)
                    if inner.st_nlink > 1 and not stat.S_ISDIR(inner.st_mode):
                        if (inner.st_dev, inner.st_ino) in seen:
                            continue
                        seen.add((inner.st_dev, inner.st_ino))
                    total += inner.st_blocks * 512
            if time.monotonic() > deadline:
                return total, False
    return total, True


# -- commands and locks ------------------------------------------------------------------------


def _is_root() -> bool:
    return os.geteuid() == 0


def _which(tool: str) -> str | None:
    return shutil.which(tool, path=SBIN_PATH)  # a worker's PATH may lack sbin


def _run(
    argv: list[str], *, what: str, ok: tuple[int, ...] | None = (0,), permanent: bool = True
) -> subprocess.CompletedProcess[str]:
    """Run one command; ``BackendError`` naming ``what`` failed, unless its exit code is in ``ok``
    (``None``: any code, for the caller to read)."""
    path = _which(argv[0])
    if path is None:
        check_can_mount()  # says which tool is missing, and what to do
        raise BackendError(f"{argv[0]} not found", permanent=True)
    try:
        done = subprocess.run(
            [path, *argv[1:]],
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT_S,
            check=False,
            env={"PATH": SBIN_PATH, "LC_ALL": "C"},
            start_new_session=True,  # a signal to the portal's processes never stops a resize halfway
        )
    except subprocess.TimeoutExpired as exc:
        raise BackendError(f"{what}: {argv[0]} did not finish in {COMMAND_TIMEOUT_S:.0f} s", permanent=False) from exc
    except OSError as exc:
        raise BackendError(f"{what}: could not run {argv[0]}: {exc.strerror}", permanent=True) from exc
    if ok is not None and done.returncode not in ok:
        output = (done.stderr.strip() or done.stdout.strip())[-500:]
        raise BackendError(f"{what}: {argv[0]} failed (exit code {done.returncode}): {output}", permanent=permanent)
    return done


@contextlib.contextmanager
def _locked(image: Path) -> Iterator[None]:
    """Hold the image's lock file: one change of an image at a time, across the portal's processes."""
    image.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(f"{image}.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _gib(size: int) -> str:
    """A size as the portal states quotas: "50 GB", "1.5 GB", "64 MB" (of 2**30 and 2**20 bytes)."""
    value, unit = (size / GIB, "GB") if size >= GIB else (size / (1 << 20), "MB")
    return f"{value:.0f} {unit}" if value >= 10 or value == int(value) else f"{value:.1f} {unit}"


if __name__ == "__main__":  # deploy/run.sh: may this portal enforce disk quotas? (exit 1, and why, if not)
    import sys

    reason = probe()
    if reason:
        print(reason, file=sys.stderr)
    sys.exit(1 if reason else 0)
