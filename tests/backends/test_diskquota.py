"""Workspace disks for real (workers/backends/diskquota.py): sparse ext4 images loop-mounted on a
workspace's directory, as root. Each test's images live in its own temporary directory, and every
mount of them is undone after it, whatever happened."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from tests.ci_skips import in_ci
from tests.leftovers import release_disks
from workers.backends import diskquota
from workers.backends.base import BackendError, DiskQuota

MIB = 1 << 20
# Mounting needs root; in CI a missing requirement fails (check_can_mount says why) rather than skips.
pytestmark = pytest.mark.skipif(os.geteuid() != 0 and not in_ci(os.environ), reason="mounting a disk image needs root")


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[DiskQuota]:
    images = tmp_path / "disks"
    yield DiskQuota(image=str(images / "workspace-1.img"), directory=str(tmp_path / "work" / "ws"), size_bytes=64 * MIB)
    release_disks(images)


def fill(directory: str, chunk: int = MIB) -> tuple[int, int | None]:
    """Write into a new file until the filesystem refuses: (bytes written, the error's errno)."""
    written, block = 0, b"x" * chunk
    try:
        with open(Path(directory, "filler"), "wb") as out:
            while written < 1 << 34:
                written += out.write(block)
                out.flush()
                os.fsync(out.fileno())
    except OSError as exc:
        return written, exc.errno
    return written, None


def test_a_writer_past_the_quota_gets_enospc_and_the_machine_keeps_its_space(disk: DiskQuota, tmp_path: Path) -> None:
    assert diskquota.ensure_mounted(disk) == ""
    host_free = shutil.disk_usage(tmp_path).free

    written, error = fill(disk.directory)

    assert error == errno.ENOSPC
    assert 48 * MIB < written <= 64 * MIB  # the whole quota (less the filesystem's own), no more
    # The machine's filesystem lost at most the image's blocks, not what the writer tried to write.
    assert host_free - shutil.disk_usage(tmp_path).free < 80 * MIB
    assert os.stat(disk.image).st_blocks * 512 <= 66 * MIB
    options = next(line for line in Path("/proc/self/mounts").read_text().splitlines() if f" {disk.directory} " in line)
    assert {"nosuid", "nodev"} <= set(options.split()[3].split(","))


def test_mounting_is_idempotent_and_a_lost_mount_comes_back_with_the_files(disk: DiskQuota) -> None:
    diskquota.ensure_mounted(disk)
    Path(disk.directory, "kept.txt").write_text("still here")
    mounts = Path("/proc/self/mountinfo").read_text().count(f" {disk.directory} ")

    diskquota.ensure_mounted(disk)
    assert Path("/proc/self/mountinfo").read_text().count(f" {disk.directory} ") == mounts == 1

    subprocess.run(["umount", disk.directory], check=True)  # as a reboot leaves it
    assert not diskquota.is_mounted(disk) and not Path(disk.directory, "kept.txt").exists()
    diskquota.ensure_mounted(disk)
    assert diskquota.is_mounted(disk) and Path(disk.directory, "kept.txt").read_text() == "still here"


def test_the_directory_keeps_its_owner_and_mode_and_holds_nothing_but_the_disk(disk: DiskQuota) -> None:
    Path(disk.directory).mkdir(parents=True, mode=0o700)
    os.chown(disk.directory, 200123, 200123)

    diskquota.ensure_mounted(disk)

    info = os.stat(disk.directory)
    assert (info.st_uid, info.st_gid, info.st_mode & 0o7777) == (200123, 200123, 0o700)
    assert oct(os.stat(Path(disk.image).parent).st_mode & 0o777) == "0o700"
    assert oct(os.stat(disk.image).st_mode & 0o777) == "0o600"


def test_files_already_in_the_directory_move_into_its_new_disk(disk: DiskQuota) -> None:
    Path(disk.directory, "job-1", "artifacts").mkdir(parents=True)
    Path(disk.directory, "job-1", "artifacts", "model.bin").write_bytes(b"weights")
    os.symlink("/etc/hostname", Path(disk.directory, "link"))

    diskquota.ensure_mounted(disk)

    assert Path(disk.directory, "job-1", "artifacts", "model.bin").read_bytes() == b"weights"
    assert os.readlink(Path(disk.directory, "link")) == "/etc/hostname"  # copied as a link, never followed
    subprocess.run(["umount", disk.directory], check=True)
    assert os.listdir(disk.directory) == []  # the originals went once copied


def test_files_that_do_not_fit_stay_where_they_are_and_the_start_is_refused(disk: DiskQuota) -> None:
    Path(disk.directory).mkdir(parents=True)
    with open(Path(disk.directory, "big"), "wb") as big:
        big.write(os.urandom(MIB) * 80)

    with pytest.raises(BackendError) as refused:
        diskquota.ensure_mounted(disk)

    assert refused.value.permanent and "do not fit its disk quota of 64 MB" in refused.value.message
    assert not diskquota.is_mounted(disk) and not Path(disk.image).exists()
    assert Path(disk.directory, "big").stat().st_size == 80 * MIB


def test_another_filesystem_on_the_directory_is_refused(disk: DiskQuota, tmp_path: Path) -> None:
    other = replace(disk, image=str(tmp_path / "disks" / "workspace-2.img"))
    diskquota.ensure_mounted(other)

    with pytest.raises(BackendError) as refused:
        diskquota.ensure_mounted(disk)

    assert refused.value.permanent and "not the workspace's disk image" in refused.value.message


def test_a_larger_quota_grows_the_disk_online_or_once_nothing_runs(disk: DiskQuota) -> None:
    """Growing a mounted filesystem needs CAP_SYS_RESOURCE, which some containers drop: there the
    disk says why it waits, and grows as soon as no workload of the workspace runs."""
    diskquota.ensure_mounted(disk)
    Path(disk.directory, "kept.txt").write_text("still here")
    larger = replace(disk, size_bytes=128 * MIB)

    note = diskquota.ensure_mounted(larger)

    if note:
        assert "grows to 128 MB" in note and os.stat(disk.image).st_size == 64 * MIB
        assert diskquota.apply_quota(larger, idle=False) == note  # a workload may run: it waits
        assert diskquota.apply_quota(larger, idle=True) == ""
    assert os.stat(disk.image).st_size == 128 * MIB
    assert diskquota.measure(disk.directory).size_bytes > 100 * MIB
    assert diskquota.is_mounted(disk) and Path(disk.directory, "kept.txt").read_text() == "still here"
    written, error = fill(disk.directory)
    assert error == errno.ENOSPC and written > 100 * MIB


def test_a_smaller_quota_waits_for_the_disk_to_be_idle_and_for_its_files_to_fit(disk: DiskQuota) -> None:
    larger = replace(disk, size_bytes=128 * MIB)
    diskquota.ensure_mounted(larger)
    Path(disk.directory, "data").write_bytes(os.urandom(MIB) * 80)

    assert "until no workload uses it" in diskquota.ensure_mounted(disk)
    assert "do not fit in 64 MB" in diskquota.apply_quota(disk, idle=True)
    assert os.stat(disk.image).st_size == 128 * MIB and diskquota.is_mounted(disk)

    Path(disk.directory, "data").unlink()
    assert diskquota.apply_quota(disk, idle=True) == ""
    assert os.stat(disk.image).st_size == 64 * MIB and diskquota.is_mounted(disk)
    assert diskquota.measure(disk.directory).size_bytes < 64 * MIB


def test_release_unmounts_and_removes_the_image(disk: DiskQuota) -> None:
    diskquota.ensure_mounted(disk)

    diskquota.release(disk.image)

    assert not diskquota.is_mounted(disk) and not Path(disk.image).exists()
    assert os.listdir(Path(disk.image).parent) == []


def test_measure_counts_the_largest_top_level_entries_without_following_links(disk: DiskQuota) -> None:
    diskquota.ensure_mounted(disk)
    root = Path(disk.directory)
    (root / "job-1").mkdir()
    (root / "job-1" / "out").write_bytes(b"x" * (3 * MIB))
    (root / "job-2" / "deep").mkdir(parents=True)
    (root / "job-2" / "deep" / "out").write_bytes(b"x" * MIB)
    os.link(root / "job-2" / "deep" / "out", root / "job-2" / "same")  # counted once
    os.symlink("/usr", root / "usr")  # a link: never walked

    usage = diskquota.measure(disk.directory)

    assert [name for name, _ in usage.largest] == ["job-1", "job-2", "usr"]
    sizes = dict(usage.largest)
    assert 3 * MIB <= sizes["job-1"] < 4 * MIB and MIB <= sizes["job-2"] < 2 * MIB and sizes["usr"] < 64 * 1024
    assert usage.complete and usage.used_bytes >= 4 * MIB and usage.size_bytes < 64 * MIB
    assert not diskquota.measure(disk.directory, budget_s=-1).complete


def test_a_portal_that_is_not_root_refuses_with_what_to_do(tmp_path: Path) -> None:
    """Run as an ordinary user for real (setpriv), as a portal started without root would."""
    tmp_path.chmod(0o755)
    code = (
        "from workers.backends import diskquota; from workers.backends.base import DiskQuota\n"
        f"diskquota.ensure_mounted(DiskQuota({str(tmp_path / 'i.img')!r}, {str(tmp_path / 'w')!r}, 1 << 26))"
    )
    done = subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c", code],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "need the portal to run as root" in done.stderr and "PORTAL_DISK_QUOTA=off" in done.stderr
    assert not (tmp_path / "i.img").exists()


def test_instances_and_notebooks_carry_their_workspaces_disk_to_the_backend(disk: DiskQuota, tmp_path: Path) -> None:
    """Their jobs are what the local backend starts (and mounts the disk for)."""
    from workers.backends.base import InstanceSpec, NotebookSpec
    from workers.backends.processes import instance_job, notebook_job

    instance = InstanceSpec(key="instance-1", workspace="ws", name="box", work_dir=str(tmp_path), disk=disk)
    notebook = NotebookSpec(
        key="notebook-1", workspace="ws", name="lab", work_dir=str(tmp_path), base_url="/", token="t", disk=disk
    )

    assert instance_job(instance).disk == notebook_job(notebook, tmp_path, sock="s").disk == disk
