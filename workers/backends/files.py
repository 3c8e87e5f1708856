"""Files in directories a workload can write, handled by the portal without following its links.

A workspace's directory belongs to its workloads (and, where the portal runs as root, to the
workspace's own Unix account). Anything in it may be a symbolic link planted by user code to make
the portal, with its own rights, read or change something else: a log swapped for a link to the
secret key, a job directory swapped for a link to ``/etc`` just before the portal gives it to the
workspace's account. Every path the portal touches there goes through this module.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import BinaryIO

from workers.backends.base import BackendError, RunAs


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
    outside ``root``."""
    real_root = os.path.realpath(root)
    try:
        fd = os.open(os.path.join(root, relative), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
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
