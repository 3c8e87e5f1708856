"""Files in directories a workload can write, handled by the portal without following its links.

A workspace's directory belongs to its workloads (and, where the portal runs as root, to the
workspace's own Unix account). Anything in it may be a symbolic link planted by user code to make
the portal, with its own rights, read or change something else: a log swapped for a link to the
secret key, a job directory swapped for a link to ``/etc`` just before the portal gives it to the
workspace's account. Every path the portal touches there goes through this module, and so do the
backends whose workloads leave their output in files (:class:`FileOutputs`: local, Slurm).
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from workers.backends.base import (
    Artifact,
    ArtifactLimits,
    Artifacts,
    Backend,
    BackendError,
    LeftOut,
    Progress,
    RunAs,
    last_progress,
)
from workers.backends.logcap import read_marker

LOG_CHUNK = 1 << 20
PROGRESS_TAIL = 64 << 10
HASH_CHUNK = 1 << 20


class FileOutputs(Backend):
    """A backend whose workloads write their logs and artifacts to files the portal reads (local, Slurm).

    Its state holds ``job_dir`` (the job's directory) and ``artifact_paths`` (relative to it), and
    ``_log_files()`` says where each replica's log is.
    """

    _state: dict[str, Any]

    def _log_files(self) -> tuple[list[str], str | None]:
        """Each replica's log file, and the directory they lie in where the workload can write there
        (``None``: the portal's own directory, which no workload reaches)."""
        raise NotImplementedError

    def logs(self, replica: int = 0, offset: int = 0) -> tuple[bytes, int]:
        """Read up to 1 MiB of ``replica``'s output (stdout and stderr) from ``offset``."""
        paths, root = self._log_files()
        if not 0 <= replica < len(paths):
            raise BackendError(f"no replica {replica}", permanent=True)
        return read_log(paths[replica], offset, root=root)

    def artifacts(self, limits: ArtifactLimits | None = None) -> Artifacts:
        """Files under the declared paths, resolved inside the job directory (escaping links
        skipped), within ``limits`` (see ``collect_artifacts``)."""
        if not self._state:
            return Artifacts(limits=limits or ArtifactLimits())
        return collect_artifacts(Path(self._state["job_dir"]), self._state["artifact_paths"], limits)

    def progress(self) -> Progress | None:
        """The last ``PROGRESS <fraction>`` line in replica 0's log (its last 64 KiB), clamped to 0..1."""
        paths, root = self._log_files()
        return read_progress(paths[0], root=root) if paths else None


def prepare_dir(path: Path | str, run_as: RunAs | None, *, mode: int = 0o700) -> Path:
    """Create ``path`` (and its missing parents) if needed and make sure it is a real directory,
    never a link; where the portal runs as root and the workspace has its own account, hand it to
    that account with ``mode``. ``BackendError(permanent=True)`` if something else is in the way."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True, mode=mode)
        info = os.lstat(path)
    except OSError as exc:
        raise BackendError(f"could not create the directory {path}: {exc.strerror}", permanent=True) from exc
    if not stat.S_ISDIR(info.st_mode):
        raise BackendError(f"{path} is not a directory (a link or a file is in its place)", permanent=True)
    if run_as is not None and os.geteuid() == 0:
        os.chown(path, run_as.uid, run_as.gid, follow_symlinks=False)
        os.chmod(path, mode, follow_symlinks=False)
    return path


def open_inside(root: Path | str, relative: str) -> BinaryIO | None:
    """Open ``root/relative`` for reading only if the file really opened lies inside ``root``.

    The check is made on the open file itself (``/proc/self/fd``), so a link swapped in between a
    check and the open cannot lead outside. ``None`` for a missing file, a directory, or anything
    outside ``root``. ``root`` is resolved as ``os.path.realpath`` resolves it, by the kernel: the
    directory is opened (``O_PATH``) and its path read back, and the file opened from it, which
    costs three system calls where resolving it component by component costs one a component
    (a reconcile pass reads thousands of logs)."""
    try:
        root_fd = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        real_root = os.readlink(f"/proc/self/fd/{root_fd}")
        fd = os.open(relative, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=root_fd)
    except OSError:
        return None
    finally:
        os.close(root_fd)
    try:
        opened = os.readlink(f"/proc/self/fd/{fd}")
        info = os.fstat(fd)
    except OSError:
        os.close(fd)
        return None
    if not stat.S_ISREG(info.st_mode) or not (opened == real_root or opened.startswith(real_root.rstrip("/") + "/")):
        os.close(fd)
        return None
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def dirs_between(top: Path, bottom: Path) -> list[Path]:
    """The directories from just below ``top`` down to ``bottom``, top first (empty when
    ``bottom`` is not below ``top``)."""
    if bottom == top or not bottom.is_relative_to(top):
        return []
    parts = bottom.relative_to(top).parts
    return [top.joinpath(*parts[: i + 1]) for i in range(len(parts))]


def write_new_file(path: Path | str, text: str, run_as: RunAs | None, *, mode: int = 0o600) -> None:
    """Write ``text`` to a fresh file at ``path`` (whatever was there, a planted link included, is
    removed first, and the new file is created without following links), owned by ``run_as``
    where the portal runs as root."""
    path = Path(path)
    try:
        path.unlink(missing_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    except OSError as exc:
        raise BackendError(f"could not write {path}: {exc.strerror}", permanent=False) from exc
    with os.fdopen(fd, "w") as out:
        if run_as is not None and os.geteuid() == 0:
            os.fchown(out.fileno(), run_as.uid, run_as.gid)
        out.write(text)


def check_reachable(path: Path | str, what: str) -> None:
    """``BackendError(permanent=True)`` unless every directory above ``path`` lets other accounts
    through (o+x): a workspace's account must reach its work directory and environment there."""
    current = Path(os.path.abspath(path))
    for parent in [*reversed(current.parents)][1:]:
        try:
            mode = os.stat(parent).st_mode
        except OSError:
            return  # made later by the portal, with modes of its choosing
        if not mode & stat.S_IXOTH:
            raise BackendError(
                f"{what} {path} cannot be reached by the workspaces' accounts: {parent} is private "
                f"(mode {stat.S_IMODE(mode):o}). Put it on storage the accounts can traverse (o+x).",
                permanent=True,
            )


def _open_log(path: str, root: str | None) -> Any:
    """A log file: where ``root`` (a directory its workload can write) is given, only a regular
    file really inside it, never what a planted link points to; else the portal's own file."""
    if root is None:
        try:
            return open(path, "rb")
        except FileNotFoundError:
            return None
    return open_inside(root, os.path.relpath(path, root))


def read_log(path: str, offset: int, *, root: str | None = None) -> tuple[bytes, int]:
    """Up to 1 MiB of a log file from ``offset``, and the offset to continue from.

    Offsets count the bytes the workload wrote: a log whose oldest part its writer dropped
    (workers/backends/logcap.py) starts with a marker line saying how many bytes, and goes on at
    that offset. Asked for dropped bytes, or past the end (a log that was written anew), it
    answers from the top of the file: the marker, if any, and what is kept."""
    log = _open_log(path, root)
    if log is None:
        return b"", offset
    with log:
        dropped, marker = read_marker(log)
        end = dropped + os.fstat(log.fileno()).st_size - marker
        if dropped <= offset <= end:
            log.seek(marker + offset - dropped)
            data = log.read(LOG_CHUNK)
            return data, offset + len(data)
        data = log.read(LOG_CHUNK)
    return data, dropped + max(0, len(data) - marker)


def read_progress(path: str, *, root: str | None = None) -> Progress | None:
    """The last ``PROGRESS <fraction>`` line in a log's last 64 KiB, clamped to 0..1."""
    log = _open_log(path, root)
    if log is None:
        return None
    with log:
        log.seek(max(0, os.fstat(log.fileno()).st_size - PROGRESS_TAIL))
        return last_progress(log.read())


def collect_artifacts(job_dir: Path, declared_paths: list[str], limits: ArtifactLimits | None = None) -> Artifacts:
    """Files under the declared paths, resolved inside ``job_dir`` (links that escape it skipped),
    within ``limits``.

    First every file is listed with its apparent size, reading nothing: in path order, a file is
    kept while the kept ones stay within the number of files and the bytes allowed, and the others
    are counted as left out. Then only the kept files are hashed."""
    limits = limits or ArtifactLimits()
    listed, more = _list_files(job_dir, declared_paths, max(10 * limits.max_files, 1000))
    kept: list[tuple[str, str, int]] = []
    over_count, over_size = [0, 0], [0, 0]
    total = 0
    for rel, real_rel, size in listed:
        if len(kept) >= limits.max_files:
            over_count[0], over_count[1] = over_count[0] + 1, over_count[1] + size
        elif total + size > limits.max_bytes:
            over_size[0], over_size[1] = over_size[0] + 1, over_size[1] + size
        else:
            kept.append((rel, real_rel, size))
            total += size
    found = [artifact for artifact in (_hashed(job_dir, *entry) for entry in kept) if artifact is not None]
    return Artifacts(
        files=found,
        limits=limits,
        over_count=LeftOut(over_count[0], over_count[1], more=more and over_count[0] > 0),
        over_size=LeftOut(over_size[0], over_size[1]),
    )


def _list_files(job_dir: Path, declared_paths: list[str], at_most: int) -> tuple[list[tuple[str, str, int]], bool]:
    """The regular files under the declared paths, sorted: (path, path of what it resolves to, both
    relative to ``job_dir``, apparent size); links leading out of ``job_dir`` or into its ``.portal``
    are skipped. Stops after ``at_most`` files (True: there were more)."""
    found: dict[str, tuple[str, str, int]] = {}
    for declared in declared_paths:
        for path in _walk_files(job_dir / declared):
            if len(found) >= at_most:
                return sorted(found.values()), True
            rel = path.relative_to(job_dir).as_posix()
            real = path.resolve()
            if rel in found or not real.is_relative_to(job_dir) or real.is_relative_to(job_dir / ".portal"):
                continue
            try:
                info = os.stat(real)
            except OSError:
                continue
            if stat.S_ISREG(info.st_mode):
                found[rel] = (rel, real.relative_to(job_dir).as_posix(), info.st_size)
    return sorted(found.values()), False


def _hashed(job_dir: Path, rel: str, real_rel: str, size: int) -> Artifact | None:
    """The artifact at ``rel``: its first ``size`` bytes (the size it was listed with, which the
    limits counted) hashed through a file opened inside the job directory, so that a link swapped in
    meanwhile (the workspace's other workloads write here) cannot make the portal read elsewhere."""
    opened = open_inside(job_dir, real_rel)
    if opened is None:
        return None
    with opened:
        hashed, digest = sha256_of_file(opened.fileno(), size)
    return Artifact(rel, hashed, digest)


def _walk_files(path: Path) -> Iterator[Path]:
    if path.is_symlink() or path.is_file():
        yield path
    elif path.is_dir():
        for dirpath, _, filenames in os.walk(path):  # does not descend into symlinked directories
            for filename in sorted(filenames):
                yield Path(dirpath, filename)


_ZEROS = bytes(HASH_CHUNK)


def sha256_of_file(fd: int, size: int) -> tuple[int, str]:
    """The sha256 (hex) of the file's first ``size`` bytes (fewer if it is shorter now), and how
    many bytes that was. Only its data is read: holes (``SEEK_DATA``/``SEEK_HOLE``) are hashed as
    the zeros they read as, without a read."""
    digest = hashlib.sha256()
    offset = 0
    while offset < size:
        data_at, hole_at = _data_region(fd, offset, size)
        _hash_zeros(digest, data_at - offset)
        offset = data_at
        while offset < hole_at:
            block = os.pread(fd, min(HASH_CHUNK, hole_at - offset), offset)
            if not block:  # shorter than listed: what there is
                return offset, digest.hexdigest()
            digest.update(block)
            offset += len(block)
    return offset, digest.hexdigest()


def _data_region(fd: int, offset: int, size: int) -> tuple[int, int]:
    """Where the next data at or after ``offset`` starts and ends, within ``size`` (``(size,
    size)``: only a hole is left). Where the filesystem cannot say, everything is data."""
    try:
        data_at = os.lseek(fd, offset, os.SEEK_DATA)
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # no data past offset: a hole up to the end
            return size, size
        return offset, size
    data_at = min(data_at, size)
    try:
        hole_at = os.lseek(fd, data_at, os.SEEK_HOLE)
    except OSError:
        hole_at = size
    return data_at, min(hole_at, size)


def _hash_zeros(digest: Any, count: int) -> None:
    while count > 0:
        step = min(count, HASH_CHUNK)
        digest.update(_ZEROS[:step] if step < HASH_CHUNK else _ZEROS)
        count -= step
