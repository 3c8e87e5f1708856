"""Blocks of uids, one per portal installation on this machine: two portals (two data directories,
as a developer or a CI runner has) never give their workspaces the same Unix account.

An installation is a data directory. Its id (random) and the block it holds are recorded there, in
``installation.json``. The machine's registry is a directory only root can enter (default
``/var/lib/gpuportal/uid-blocks``, 0700) with one file per claim, ``<first uid>-<last uid>.json``,
naming the installation's id and data directory. A claim is made with ``O_EXCL`` while holding the
registry's lock (``flock`` on ``.lock``), so two portals starting at once cannot take the same block.

A claim is *live* while its data directory holds the same installation id; otherwise it is *stale*
(the data directory was deleted or started afresh), and the next portal that claims releases it:
the accounts it made (their comment names its installation) are deleted, then its file, but only
while no process runs as one of the block's uids. A block held by a live installation is never
taken: asking for it by number is refused with the other installation's data directory.

Accounts are named ``gpw<uid>``, and their comment (GECOS) names the installation; earlier releases
named them ``gpw<N>`` (uid ``PORTAL_WORKSPACE_UID_MIN + N``) with a comment naming only the
workspace. Those are adopted by the installation that recorded them on its workspaces, which then
holds the first block (apps/workspaces/unix.py). Nothing here imports Django.
"""

from __future__ import annotations

import contextlib
import fcntl
import grp
import json
import os
import pwd
import re
import secrets
import shutil
import subprocess
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

from workers.backends.base import BackendError

#: The registry of this machine's claims, where ``PORTAL_UID_REGISTRY_DIR`` does not say otherwise.
DEFAULT_REGISTRY = "/var/lib/gpuportal/uid-blocks"
#: The file in a data directory naming its installation and the block it holds.
INSTALLATION_FILE = "installation.json"
#: What earlier releases wrote as an account's comment, and what this one writes.
LEGACY_COMMENT_PREFIX = "GPU Portal workspace "
_TAG_RE = re.compile(r"\(installation ([0-9a-f]{16})\)")
_CLAIM_RE = re.compile(r"^([0-9]{1,10})-([0-9]{1,10})\.json$")
SBIN_PATH = "/usr/sbin:/sbin:/usr/bin:/bin"
COMMAND_TIMEOUT_S = 30.0


class UidBlockError(BackendError):
    """No block can be held: another installation holds it, the registry is not root's alone, or
    no block of the range is free. Permanent: the operator must act; the message says how."""

    def __init__(self, message: str) -> None:
        super().__init__(message, permanent=True)


@dataclass(frozen=True)
class Block:
    """One installation's claim: uids ``first_uid`` .. ``last_uid`` are its workspaces' accounts."""

    installation_id: str
    data_dir: str
    first_uid: int
    last_uid: int
    claimed_at: str = ""

    @property
    def file_name(self) -> str:
        return f"{self.first_uid}-{self.last_uid}.json"

    def overlaps(self, first: int, last: int) -> bool:
        return self.first_uid <= last and first <= self.last_uid

    def holds(self, uid: int) -> bool:
        return self.first_uid <= uid <= self.last_uid


def account_name(uid: int) -> str:
    """A new account's name: unique on the machine as its uid is."""
    return f"gpw{uid}"


def account_comment(workspace_name: str, installation_id: str) -> str:
    return f"{LEGACY_COMMENT_PREFIX}{workspace_name} (installation {installation_id})"


def comment_installation(comment: str) -> str | None:
    """The installation an account's comment names (``None``: made by an earlier release, or not the portal's)."""
    found = _TAG_RE.search(comment)
    return found.group(1) if found else None


def is_legacy_comment(comment: str) -> bool:
    return comment.startswith(LEGACY_COMMENT_PREFIX) and comment_installation(comment) is None


# -- the data directory's record ------------------------------------------------------------------


def read_installation(data_dir: Path) -> dict[str, object] | None:
    try:
        record = json.loads((data_dir / INSTALLATION_FILE).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and isinstance(record.get("installation_id"), str) else None


def _write_installation(data_dir: Path, record: dict[str, object]) -> None:
    """Atomically: a reader sees the old record or the new one, never half of one."""
    data_dir.mkdir(parents=True, exist_ok=True)
    temporary = data_dir / f".{INSTALLATION_FILE}.{os.getpid()}"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump(record, out, indent=1)
        out.flush()
        os.fsync(out.fileno())
    os.replace(temporary, data_dir / INSTALLATION_FILE)


def _installation_id(data_dir: Path) -> str:
    """This data directory's installation id, made (and recorded) on first use."""
    record = read_installation(data_dir)
    if record is not None:
        return str(record["installation_id"])
    installation_id = secrets.token_hex(8)
    _write_installation(data_dir, {"installation_id": installation_id})
    return installation_id


def is_live(block: Block) -> bool:
    """Whether the installation that made ``block`` still exists: its data directory names it."""
    record = read_installation(Path(block.data_dir))
    return record is not None and record["installation_id"] == block.installation_id


# -- the registry ---------------------------------------------------------------------------------


def _open_registry(registry: Path) -> Path:
    """The registry directory, made root's and 0700 if missing; refused if anyone else could write
    into it (a forged claim would make a portal delete accounts)."""
    try:
        registry.mkdir(parents=True, exist_ok=True, mode=0o700)
        info = os.lstat(registry)
    except OSError as exc:
        raise UidBlockError(f"the uid block registry {registry} cannot be made: {exc.strerror}") from exc
    if not os.path.isdir(registry) or os.path.islink(registry) or info.st_uid != 0 or info.st_mode & 0o077:
        raise UidBlockError(
            f"the uid block registry {registry} must be a directory of root's with mode 0700 "
            f"(it is {'a link' if os.path.islink(registry) else oct(info.st_mode & 0o7777)}, owner uid "
            f"{info.st_uid}); fix it with: chown root:root {registry}; chmod 0700 {registry}"
        )
    return registry


@contextlib.contextmanager
def locked(registry: Path) -> Iterator[Path]:
    """The registry, held alone by this process (its ``flock``) for the ``with`` block."""
    path = _open_registry(registry)
    fd = os.open(path / ".lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield path
    finally:
        os.close(fd)


def claims(registry: Path) -> list[Block]:
    """Every claim in the registry, by first uid. A file that cannot be read as one is skipped."""
    found = []
    for entry in sorted(registry.iterdir()) if registry.is_dir() else []:
        if not _CLAIM_RE.match(entry.name) or entry.is_symlink():
            continue
        try:
            data = json.loads(entry.read_text())
            found.append(Block(**{k: data[k] for k in ("installation_id", "data_dir", "first_uid", "last_uid")},
                               claimed_at=str(data.get("claimed_at", ""))))  # fmt: skip
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return sorted(found, key=lambda b: b.first_uid)


def _write_claim(registry: Path, block: Block) -> None:
    """Create the claim's file; it exists already only where the lock was not held."""
    try:
        fd = os.open(registry / block.file_name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError as exc:
        raise UidBlockError(f"uids {block.first_uid}-{block.last_uid} were claimed meanwhile; start again") from exc
    with os.fdopen(fd, "w") as out:
        json.dump(asdict(block), out, indent=1)
        out.flush()
        os.fsync(out.fileno())
    dir_fd = os.open(registry, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


# -- claiming -------------------------------------------------------------------------------------


def claim(
    registry: Path,
    data_dir: Path,
    *,
    uid_min: int,
    uid_max: int,
    block_size: int,
    pinned: int | None = None,
    adoptable: Iterable[int] = (),
) -> Block:
    """The block of the installation in ``data_dir``, claimed in ``registry`` if it holds none yet.

    Blocks are ``block_size`` uids from ``uid_min``; block ``pinned`` (a number) where given, else
    the first free one past block 0, which is kept for the accounts of earlier releases: an
    installation with ``adoptable`` accounts there (uids its workspaces recorded) asks for it first.
    Stale claims are released on the way (``release_stale``). ``UidBlockError`` where the block
    held or asked for overlaps another live installation's, or no block is free."""
    data_dir = data_dir.resolve()
    with locked(registry) as path:
        release_stale(path)
        installation_id = _installation_id(data_dir)
        held = claims(path)
        mine = [b for b in held if b.installation_id == installation_id]
        record = read_installation(data_dir) or {}
        if "first_uid" in record:
            return _confirm(path, data_dir, installation_id, record, held, pinned, uid_min, block_size)
        if mine:  # claimed, then the record was lost: keep what the registry says
            block = mine[0]
        else:
            block = _choose(path, data_dir, installation_id, held, uid_min, uid_max, block_size, pinned, set(adoptable))
            _write_claim(path, block)
        _write_installation(data_dir, {"installation_id": installation_id, **_range(block)})
        return block


def _range(block: Block) -> dict[str, object]:
    return {"first_uid": block.first_uid, "last_uid": block.last_uid, "registry_file": block.file_name}


def _confirm(
    registry: Path,
    data_dir: Path,
    installation_id: str,
    record: dict[str, object],
    held: list[Block],
    pinned: int | None,
    uid_min: int,
    block_size: int,
) -> Block:
    """The block this installation recorded: still its own in the registry (made again where the
    registry lost it), unless another live installation's claim overlaps it."""
    first, last = int(str(record["first_uid"])), int(str(record["last_uid"]))
    if pinned is not None and first != uid_min + pinned * block_size:
        raise UidBlockError(
            f"this installation ({data_dir}) holds uids {first}-{last}, not block {pinned}: unset "
            "PORTAL_WORKSPACE_UID_BLOCK, or release its block first (docs/operations.md)"
        )
    for other in held:
        if other.overlaps(first, last) and other.installation_id != installation_id:
            raise _held_by(other, first, last)
    own = [b for b in held if b.installation_id == installation_id and b.first_uid == first]
    if own:
        return own[0]
    block = Block(installation_id, str(data_dir), first, last, _now())
    _write_claim(registry, block)
    return block


def _choose(
    registry: Path,
    data_dir: Path,
    installation_id: str,
    held: list[Block],
    uid_min: int,
    uid_max: int,
    block_size: int,
    pinned: int | None,
    adoptable: set[int],
) -> Block:
    count = (uid_max - uid_min + 1) // block_size
    if pinned is not None and not 0 <= pinned < count:
        raise UidBlockError(f"PORTAL_WORKSPACE_UID_BLOCK={pinned}: the range has blocks 0-{count - 1} only")
    # Block 0 is where earlier releases made every portal's accounts: last, unless adopting them.
    order = [pinned] if pinned is not None else [0, *range(1, count)] if adoptable else [*range(1, count), 0]
    taken = {p.pw_uid for p in pwd.getpwall()} | {g.gr_gid for g in grp.getgrall()}
    for number in order:
        first = uid_min + number * block_size
        last = first + block_size - 1
        others = [b for b in held if b.overlaps(first, last)]
        if others:
            if pinned is not None:
                raise _held_by(others[0], first, last)
            continue
        in_use = sorted(u for u in taken if first <= u <= last and u not in adoptable)
        if in_use and (pinned is None or _tagged_by_others(in_use, installation_id)):
            if pinned is not None:
                raise UidBlockError(
                    f"block {pinned} (uids {first}-{last}) has accounts of another installation "
                    f"({', '.join(_names(in_use[:5]))}); choose another PORTAL_WORKSPACE_UID_BLOCK"
                )
            continue
        return Block(installation_id, str(data_dir), first, last, _now())
    raise UidBlockError(
        f"no block of {block_size} uids is free in {uid_min}-{uid_max}: every one is held by another "
        f"installation or has accounts; see {registry} and widen PORTAL_WORKSPACE_UID_MAX"
    )


def _held_by(other: Block, first: int, last: int) -> UidBlockError:
    state = "live" if is_live(other) else "stale, with processes still running as its accounts"
    return UidBlockError(
        f"uids {first}-{last} are held by another GPU Portal installation ({state}), whose data directory "
        f"is {other.data_dir} (installation {other.installation_id}, claimed at {other.claimed_at or '?'}). "
        "Give this installation another block (unset PORTAL_WORKSPACE_UID_BLOCK or pick a free one); "
        "release that one only once it is no longer used (docs/operations.md)."
    )


def _tagged_by_others(uids: list[int], installation_id: str) -> bool:
    for uid in uids:
        with contextlib.suppress(KeyError):
            owner = comment_installation(pwd.getpwuid(uid).pw_gecos)
            if owner is not None and owner != installation_id:
                return True
    return False


def _names(uids: list[int]) -> list[str]:
    names = []
    for uid in uids:
        try:
            names.append(f"{pwd.getpwuid(uid).pw_name} ({uid})")
        except KeyError:
            names.append(f"group {uid}")
    return names


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


# -- releasing ------------------------------------------------------------------------------------


def running_uids() -> set[int]:
    """Every uid (real, effective, saved or filesystem) a process on this machine runs as."""
    uids: set[int] = set()
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            for line in status.read_text().splitlines():
                if line.startswith("Uid:"):
                    uids.update(int(u) for u in line.split()[1:])
                    break
        except (OSError, ValueError):
            continue  # the process ended meanwhile
    return uids


def block_accounts(block: Block) -> list[pwd.struct_passwd]:
    """The accounts ``block``'s installation made (or adopted): in its range, its id in their comment."""
    return [
        p for p in pwd.getpwall() if block.holds(p.pw_uid) and comment_installation(p.pw_gecos) == block.installation_id
    ]


def release(registry: Path, block: Block) -> list[str]:
    """Delete ``block``'s accounts (and their groups) and its claim; the registry's lock must be
    held. Returns the names deleted. ``UidBlockError`` while a process runs as one of its uids:
    nothing is deleted then."""
    busy = sorted(running_uids() & set(range(block.first_uid, block.last_uid + 1)))
    if busy:
        raise UidBlockError(
            f"uids {block.first_uid}-{block.last_uid} of the installation in {block.data_dir} are not released: "
            f"processes still run as {', '.join(_names(busy[:5]))}"
        )
    deleted = []
    for account in block_accounts(block):
        run_sbin(["userdel", account.pw_name], ok=(0, 6))  # 6: gone meanwhile
        with contextlib.suppress(KeyError):
            if grp.getgrnam(account.pw_name).gr_gid == account.pw_uid:
                run_sbin(["groupdel", account.pw_name], ok=(0, 6))
        deleted.append(account.pw_name)
    with contextlib.suppress(FileNotFoundError):
        (registry / block.file_name).unlink()
    return deleted


def release_stale(registry: Path) -> list[Block]:
    """Release every stale claim whose uids no process runs as (the registry's lock held); a busy
    one stays until a later claim finds it idle. Returns those released."""
    released = []
    for block in claims(registry):
        if is_live(block):
            continue
        with contextlib.suppress(UidBlockError):
            release(registry, block)
            released.append(block)
    return released


def run_sbin(argv: list[str], *, ok: tuple[int, ...] = (0,)) -> subprocess.CompletedProcess[str]:
    """Run an account tool (``useradd``, ``usermod``, ``userdel``...): a worker's PATH may lack sbin.
    ``BackendError`` (transient) where it cannot run or exits with a code not in ``ok``."""
    argv = [shutil.which(argv[0], path=SBIN_PATH) or argv[0], *argv[1:]]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BackendError(f"could not run {argv[0]}: {exc}", permanent=False) from exc
    if done.returncode not in ok:
        raise BackendError(f"{' '.join(argv[:1] + argv[-1:])} failed: {done.stderr.strip()[-500:]}", permanent=False)
    return done
