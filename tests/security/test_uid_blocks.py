"""Two portals on one machine (two data directories) give their workspaces accounts of their own.

Each installation holds a block of uids in the machine's registry (workers/backends/uidblocks.py):
workspace 3 of one is never workspace 3 of the other, so a workload of one cannot read the other's
files even where it can see them. Every test here works in a registry, data directories and a uid
range of its own (``/tmp/gp-accounts-*``, a range no one else uses), and deletes every account it
made, so it never touches the accounts of a portal running on the machine.
"""

from __future__ import annotations

import contextlib
import grp
import io
import os
import pwd
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from apps.workspaces import unix
from apps.workspaces.models import Workspace
from tests.personas import World
from workers.backends import uidblocks
from workers.backends.base import JobSpec, RunAs
from workers.backends.local import LocalBackend
from workers.backends.uidblocks import UidBlockError

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="workspace accounts are made only by a portal run as root")

BLOCK_SIZE = 1_000_000
BLOCKS = 4


@dataclass
class Machine:
    """A registry and a range of uids of this test's own, with the data directories of its portals."""

    base: Path
    uid_min: int
    settings: Any
    made: list[str] = field(default_factory=list)  # accounts the test made itself (as an earlier release did)

    @property
    def registry(self) -> Path:
        return self.base / "registry"

    @property
    def uid_max(self) -> int:
        return self.uid_min + BLOCKS * BLOCK_SIZE - 1

    def data_dir(self, name: str) -> Path:
        return self.base / name

    def become(self, name: str, *, pinned: int | None = None) -> Path:
        """Run as the portal whose data directory is ``name`` from now on."""
        data_dir = self.data_dir(name)
        data_dir.mkdir(mode=0o700, exist_ok=True)
        self.settings.DATA_DIR = data_dir
        self.settings.PORTAL_UID_REGISTRY_DIR = self.registry
        self.settings.PORTAL_WORKSPACE_UID_MIN = self.uid_min
        self.settings.PORTAL_WORKSPACE_UID_MAX = self.uid_max
        self.settings.PORTAL_WORKSPACE_UID_BLOCK_SIZE = BLOCK_SIZE
        self.settings.PORTAL_WORKSPACE_UID_BLOCK = pinned
        return data_dir

    def claim(self, name: str, *, pinned: int | None = None) -> uidblocks.Block:
        return uidblocks.claim(
            self.registry, self.data_dir(name), uid_min=self.uid_min, uid_max=self.uid_max,
            block_size=BLOCK_SIZE, pinned=pinned,
        )  # fmt: skip

    def block_number(self, block: uidblocks.Block) -> int:
        return (block.first_uid - self.uid_min) // BLOCK_SIZE

    def cleanup(self) -> None:
        """Delete the accounts of this test's range that it made: those its installations' comments
        name, and those it made by hand. Nothing else on the machine has a uid in the range."""
        ids = {str((uidblocks.read_installation(d) or {}).get("installation_id")) for d in self.base.iterdir()}
        for account in pwd.getpwall():
            if not self.uid_min <= account.pw_uid <= self.uid_max:
                continue
            if uidblocks.comment_installation(account.pw_gecos) in ids or account.pw_name in self.made:
                subprocess.run(["userdel", account.pw_name], capture_output=True, check=False)
                with contextlib.suppress(KeyError):
                    if grp.getgrnam(account.pw_name).gr_gid == account.pw_uid:
                        subprocess.run(["groupdel", account.pw_name], capture_output=True, check=False)
        shutil.rmtree(self.base, ignore_errors=True)


@pytest.fixture
def machine(settings: Any) -> Iterator[Machine]:
    base = Path(tempfile.mkdtemp(prefix="gp-accounts-", dir="/tmp"))
    taken = {p.pw_uid for p in pwd.getpwall()} | {g.gr_gid for g in grp.getgrall()}
    while True:  # a range of 4 million uids under 2^31 that no account or group of the machine is in
        uid_min = 1_100_000_000 + random.randrange(200) * BLOCKS * BLOCK_SIZE
        if not any(uid_min <= uid < uid_min + BLOCKS * BLOCK_SIZE for uid in taken):
            break
    made = Machine(base, uid_min, settings)
    unix._BLOCKS.clear()
    try:
        yield made
    finally:
        unix._BLOCKS.clear()
        made.cleanup()


def run_as(machine: Machine, installation: str, workspace: Workspace) -> RunAs:
    machine.become(installation)
    account = unix.workspace_run_as(workspace)
    assert account is not None
    return account


def run_job(spec: JobSpec, started: list[LocalBackend]) -> str:
    backend = LocalBackend()
    started.append(backend)
    backend.start(spec)
    wait_for(lambda: not backend.poll().running)
    return backend.logs(0)[0].decode()


def wait_for(check: Callable[[], Any], timeout_s: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (result := check()):
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)
    return result


def test_two_installations_give_workspace_3_accounts_of_their_own_and_cannot_read_each_others_files(
    machine: Machine, world: World, started: list[LocalBackend]
) -> None:
    workspace = world.team_a  # the same workspace id in both portals' databases
    a, b = run_as(machine, "portal-a", workspace), run_as(machine, "portal-b", workspace)

    assert a.uid != b.uid and a.user != b.user
    assert {a.user, b.user} == {f"gpw{a.uid}", f"gpw{b.uid}"}
    # Files on one filesystem both portals' workloads see, as a shared disk or Slurm's storage is.
    shared = machine.base / "shared"
    shared.mkdir(mode=0o755)
    written = run_job(
        JobSpec(key="job-a", workspace="team-a", name="a", work_dir=str(shared / "a"), run_as=a,
                command="echo the secret of portal a > secret.txt; chmod 600 secret.txt; id -u"),
        started,
    )  # fmt: skip
    assert written.split() == [str(a.uid)]
    secret = shared / "a" / "job-a" / "secret.txt"
    assert (secret.stat().st_uid, secret.stat().st_mode & 0o777) == (a.uid, 0o600)

    # Portal b's workload sees portal a's directory (its sandbox is given the parent of both) ...
    probe = f"id -u; cat {secret}; echo read=$?; ls {shared / 'a'}; echo list=$?"
    read = run_job(
        JobSpec(key="job-b", workspace="team-a", name="b", work_dir=str(shared / "b"), writable_dir=str(shared),
                run_as=b, command=probe),
        started,
    )  # fmt: skip
    # ... and Unix permissions keep it out: its account is not portal a's.
    assert read.splitlines()[0] == str(b.uid)
    assert "the secret of portal a" not in read
    assert "read=1" in read and "list=2" in read, read
    assert "Permission denied" in read


def test_a_second_installation_gets_another_block_and_one_asked_for_by_number_is_refused(machine: Machine) -> None:
    for name in ("portal-a", "portal-b", "portal-c"):
        machine.data_dir(name).mkdir()
    first = machine.claim("portal-a")
    second = machine.claim("portal-b")

    assert not second.overlaps(first.first_uid, first.last_uid)
    assert machine.claim("portal-a") == first  # a restart keeps its block
    assert uidblocks.read_installation(machine.data_dir("portal-a"))["first_uid"] == first.first_uid  # type: ignore[index]
    with pytest.raises(UidBlockError) as refused:
        machine.claim("portal-c", pinned=machine.block_number(first))
    assert str(machine.data_dir("portal-a")) in refused.value.message
    assert "held by another GPU Portal installation (live)" in refused.value.message
    assert [b.installation_id for b in uidblocks.claims(machine.registry)] == [
        b.installation_id for b in sorted((first, second), key=lambda b: b.first_uid)
    ]
    assert "first_uid" not in (uidblocks.read_installation(machine.data_dir("portal-c")) or {})


def test_a_portal_refuses_to_start_on_a_block_another_installation_holds(machine: Machine, db: None) -> None:
    from django.db import connection

    machine.data_dir("portal-a").mkdir()
    held = machine.claim("portal-a")
    database = connection.settings_dict
    env = {
        **os.environ,
        "DATABASE_URL": f"postgres://{database['USER']}:{database['PASSWORD']}@{database['HOST']}:{database['PORT']}/"
        f"{database['NAME']}",
        "PORTAL_DATA_DIR": str(machine.data_dir("portal-b")),
        "PORTAL_UID_REGISTRY_DIR": str(machine.registry),
        "PORTAL_WORKSPACE_UID_MIN": str(machine.uid_min),
        "PORTAL_WORKSPACE_UID_MAX": str(machine.uid_max),
        "PORTAL_WORKSPACE_UID_BLOCK_SIZE": str(BLOCK_SIZE),
        "PORTAL_WORKSPACE_UID_BLOCK": str(machine.block_number(held)),
    }

    def start(env: dict[str, str]) -> subprocess.CompletedProcess[str]:  # what the embedded portal runs at start
        argv = [sys.executable, "manage.py", "uid_blocks"]
        return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, check=False)

    refused = start(env)

    assert refused.returncode != 0
    assert f"is {machine.data_dir('portal-a')} (installation {held.installation_id}" in refused.stderr, refused.stderr
    assert "first_uid" not in (uidblocks.read_installation(machine.data_dir("portal-b")) or {})
    del env["PORTAL_WORKSPACE_UID_BLOCK"]  # left to choose, it takes a free block
    started = start(env)
    assert started.returncode == 0, started.stderr
    assert uidblocks.read_installation(machine.data_dir("portal-b"))["first_uid"] != held.first_uid  # type: ignore[index]


def test_a_stale_claim_is_released_with_its_accounts_once_none_of_them_runs(machine: Machine, world: World) -> None:
    gone = run_as(machine, "portal-a", world.team_a)
    [stale] = uidblocks.claims(machine.registry)
    shutil.rmtree(machine.data_dir("portal-a"))  # the portal is deleted; its account is still there
    assert pwd.getpwuid(gone.uid).pw_name == gone.user
    still_running = subprocess.Popen(["setpriv", f"--reuid={gone.uid}", f"--regid={gone.gid}", "--clear-groups",
                                      "sleep", "60"])  # fmt: skip
    try:
        wait_for(lambda: gone.uid in uidblocks.running_uids())
        machine.data_dir("portal-b").mkdir()
        machine.claim("portal-b")  # a process still runs as the account: nothing is released yet
        assert pwd.getpwuid(gone.uid).pw_name == gone.user
        assert stale in uidblocks.claims(machine.registry)
    finally:
        still_running.send_signal(signal.SIGKILL)
        still_running.wait()

    machine.data_dir("portal-c").mkdir()
    machine.claim("portal-c")

    with pytest.raises(KeyError):
        pwd.getpwuid(gone.uid)
    with pytest.raises(KeyError):
        grp.getgrnam(gone.user)
    assert stale not in uidblocks.claims(machine.registry)  # its uids are free for another installation


def test_the_accounts_an_earlier_release_made_are_adopted_by_their_installation_alone(
    machine: Machine, world: World, started: list[LocalBackend]
) -> None:
    number = next(n for n in range(random.randrange(1000, 900_000), BLOCK_SIZE) if not _exists(f"gpw{n}"))
    uid = machine.uid_min + number  # as earlier releases made it: gpw<N>, uid PORTAL_WORKSPACE_UID_MIN + N
    workspace = Workspace.objects.create(pk=number, name="legacy", unix_uid=uid)
    name = f"gpw{number}"
    machine.made.append(name)
    subprocess.run(["groupadd", "--gid", str(uid), name], check=True)
    subprocess.run(["useradd", "--uid", str(uid), "--gid", str(uid), "--no-create-home", "--shell", "/usr/sbin/nologin",
                    "--comment", "GPU Portal workspace legacy", name], check=True)  # fmt: skip
    old = machine.base / "old-work" / "legacy"
    old.mkdir(parents=True)
    (old / "model.txt").write_text("trained before the upgrade\n")
    for path in (old, old / "model.txt"):
        os.chown(path, uid, uid)
    old.chmod(0o700)
    (old / "model.txt").chmod(0o600)

    adopted = run_as(machine, "portal-legacy", workspace)

    assert adopted == RunAs(name, uid, uid)
    assert unix.installation_block().first_uid == machine.uid_min
    installation = uidblocks.read_installation(machine.data_dir("portal-legacy"))
    assert installation is not None
    tagged = f"GPU Portal workspace legacy (installation {installation['installation_id']})"
    assert pwd.getpwuid(uid).pw_gecos == tagged
    read = run_job(
        JobSpec(key="job-1", workspace="legacy", name="x", work_dir=str(old), writable_dir=str(old), run_as=adopted,
                command="id -un; cat ../model.txt"),
        started,
    )  # fmt: skip
    assert read.splitlines() == [name, "trained before the upgrade"]

    # Another portal on the machine whose workspace of the same id recorded the same account (both
    # ran an earlier release): the account is the first one's now, and this one gets its own.
    other = run_as(machine, "portal-other", workspace)
    assert other.uid != uid and other.user == f"gpw{other.uid}"
    assert pwd.getpwuid(uid).pw_gecos == tagged


def _exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        try:
            grp.getgrnam(name)
        except KeyError:
            return False
    return True


def test_a_block_is_released_by_hand_once_its_installation_is_gone(machine: Machine, world: World) -> None:
    account = run_as(machine, "portal-a", world.team_a)
    [block] = uidblocks.claims(machine.registry)
    listed = io.StringIO()
    call_command("uid_blocks", "--list", stdout=listed)
    assert (
        f"{block.first_uid}-{block.last_uid}  live   1 account(s)  {machine.data_dir('portal-a')}" in listed.getvalue()
    )

    with pytest.raises(CommandError, match="still exists: stop that portal and delete its data directory"):
        call_command("uid_blocks", "--release", str(block.first_uid))
    assert pwd.getpwuid(account.uid).pw_name == account.user

    shutil.rmtree(machine.data_dir("portal-a"))
    released = io.StringIO()
    call_command("uid_blocks", "--release", str(block.first_uid), stdout=released)

    assert f"deleted accounts: {account.user}" in released.getvalue()
    with pytest.raises(KeyError):
        pwd.getpwuid(account.uid)
    assert uidblocks.claims(machine.registry) == []


def test_a_registry_anyone_else_could_write_is_refused(machine: Machine) -> None:
    machine.data_dir("portal-a").mkdir()
    machine.registry.mkdir(mode=0o700)
    machine.registry.chmod(0o770)

    with pytest.raises(UidBlockError, match="must be a directory of root's with mode 0700"):
        machine.claim("portal-a")
    assert not (machine.registry / ".lock").exists()


def test_a_portal_not_run_as_root_makes_no_account_and_claims_no_block(
    machine: Machine, world: World, monkeypatch: Any
) -> None:
    machine.become("portal-a")
    monkeypatch.setattr(os, "geteuid", lambda: 1000)

    assert unix.workspace_run_as(world.team_a) is None
    assert not machine.registry.exists()
    assert uidblocks.read_installation(machine.data_dir("portal-a")) is None
