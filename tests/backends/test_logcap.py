"""A replica's log under its cap (workers/backends/logcap.py): the writer, the reader's offsets
across a rewrite, and the local backend's jobs, for real: a flood, a stop, the exit status."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from workers.backends import JobSpec
from workers.backends.files import read_log
from workers.backends.local import LocalBackend
from workers.backends.logcap import MIN_MAX_BYTES, READ_SIZE, CappedLog

WRITER = Path(__file__).resolve().parents[2] / "workers" / "backends" / "logcap.py"
CAP = MIN_MAX_BYTES
MARKER = re.compile(rb"\[portal\] log truncated: (\d+) bytes dropped\n")


def numbered_lines(count: int) -> bytes:
    return b"".join(b"line %06d\n" % i for i in range(count))


def split_marker(data: bytes) -> tuple[int, bytes]:
    """(bytes dropped, what follows the marker) of a log that starts with one."""
    found = MARKER.match(data)
    assert found, data[:80]
    return int(found.group(1)), data[found.end() :]


def read_all(path: Path, offset: int) -> tuple[bytes, int]:
    """Everything from ``offset`` on, read as a follower does: one chunk at a time."""
    text = b""
    while True:
        data, offset = read_log(str(path), offset)
        if not data:
            return text, offset
        text += data


def test_the_writer_keeps_the_latest_part_of_a_flood_under_its_cap(tmp_path: Path) -> None:
    log = tmp_path / "replica-0.log"
    stream = numbered_lines(50_000)  # 550 KB, eight times the cap

    done = subprocess.run([sys.executable, "-I", str(WRITER), str(log), str(CAP)], input=stream, check=False)

    data = log.read_bytes()
    assert done.returncode == 0
    assert len(data) <= CAP + READ_SIZE
    dropped, kept = split_marker(data)
    assert stream[dropped:] == kept  # exactly the end of the output, nothing lost after the cut
    assert kept.startswith(b"line ") and len(kept) >= CAP // 2 - 11  # from a line's start, half the cap at least
    assert not (tmp_path / "replica-0.log.tmp").exists()


def test_a_log_that_cannot_be_written_never_stops_the_workload() -> None:
    """A full disk (``/dev/full`` fails every write): the writer reads on to the end and drops."""
    pipeline = f'head -c 1000000 /dev/zero | {sys.executable} -I {WRITER} /dev/full {CAP}; echo "${{PIPESTATUS[*]}}"'

    done = subprocess.run(["bash", "-c", pipeline], capture_output=True, text=True, check=False)

    assert done.stdout == "0 0\n"  # the command was not killed by a closed pipe; the writer ended well
    assert "log not written from here on" in done.stderr


def test_a_follower_that_keeps_up_reads_every_byte_once_across_rewrites(tmp_path: Path) -> None:
    log = tmp_path / "replica-0.log"
    writer = CappedLog(str(log), CAP)
    stream = numbered_lines(30_000)
    followed, offset = b"", 0
    for start in range(0, len(stream), 4000):
        writer.write(stream[start : start + 4000])
        data, offset = read_all(log, offset)
        followed += data
    writer.close()

    assert MARKER.match(log.read_bytes())  # the file was rewritten on the way
    assert followed == stream and offset == len(stream)


def test_a_reader_that_fell_behind_gets_the_marker_and_what_is_kept(tmp_path: Path) -> None:
    log = tmp_path / "replica-0.log"
    writer = CappedLog(str(log), CAP)
    stream = numbered_lines(30_000)
    writer.write(stream)
    writer.close()
    dropped, kept = split_marker(log.read_bytes())

    assert read_all(log, 0) == (log.read_bytes(), len(stream))  # from the top: the marker first
    assert read_all(log, dropped - 1)[0] == log.read_bytes()
    assert read_all(log, dropped + 5) == (kept[5:], len(stream))  # an offset still kept: as it was
    assert read_log(str(log), len(stream)) == (b"", len(stream))


def test_an_offset_past_the_end_of_a_log_that_shrank_reads_from_the_top(tmp_path: Path) -> None:
    log = tmp_path / "replica-0.log"
    log.write_bytes(b"a new attempt\n")  # an earlier, longer log was read up to offset 500

    assert read_log(str(log), 500) == (b"a new attempt\n", 14)

    writer = CappedLog(str(log), CAP)
    writer.write(numbered_lines(20_000))
    writer.close()
    data, offset = read_log(str(log), 10**12)
    assert MARKER.match(data) and offset == 14 + 20_000 * 12


def test_a_marker_with_a_number_too_large_for_an_offset_is_not_taken_for_one(tmp_path: Path) -> None:
    log = tmp_path / "replica-0.log"
    forged = b"[portal] log truncated: 999999999999999999999 bytes dropped\n"  # too long to be one
    log.write_bytes(forged + b"hello\n")

    assert read_all(log, 0) == (forged + b"hello\n", len(forged) + 6)


# -- the local backend ---------------------------------------------------------------------------

DEADLINE_S = 30.0


def wait_for(check: Callable[[], Any], timeout: float = DEADLINE_S) -> Any:
    deadline = time.monotonic() + timeout
    while not (result := check()):
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)
    return result


@pytest.fixture
def backends() -> Iterator[list[LocalBackend]]:
    started: list[LocalBackend] = []
    yield started
    for backend in started:
        if backend.get_state():
            backend.stop(grace_s=0)


def start(backends: list[LocalBackend], tmp_path: Path, command: str, sandbox: str) -> LocalBackend:
    backend = LocalBackend(sandbox=sandbox, log_max_bytes=CAP, run_dir=str(tmp_path / "run"))
    backends.append(backend)
    backend.start(JobSpec(key="job-1", workspace="ws", name="x", command=command, work_dir=str(tmp_path / "ws")))
    return backend


def ended(backend: LocalBackend) -> Any:
    return wait_for(lambda: (lambda status: None if status.running else status)(backend.poll()))


@pytest.mark.parametrize("sandbox", ["bwrap", "off"])
def test_a_job_that_floods_its_log_stays_under_the_cap_with_its_last_lines_and_exit_code(
    backends: list[LocalBackend], tmp_path: Path, sandbox: str
) -> None:
    command = "yes xxxxxxxxx | head -c 5000000; echo last line >&2; exit 3"  # 500,000 lines
    backend = start(backends, tmp_path, command, sandbox)

    status = ended(backend)

    log = Path(backend.get_state()["replicas"][0]["log"])
    assert status.exit_code == 3  # the command's status, not its log writer's
    assert log.stat().st_size <= CAP + READ_SIZE
    text, offset = read_all(log, 0)
    dropped, kept = split_marker(text)
    assert kept.endswith(b"xxxxxxxxx\nlast line\n") and kept.startswith(b"xxxxxxxxx\n")
    assert offset == dropped + len(kept) == 5_000_010


@pytest.mark.parametrize("sandbox", ["bwrap", "off"])
def test_a_stopped_job_keeps_its_grace_and_its_last_lines_reach_the_log(
    backends: list[LocalBackend], tmp_path: Path, sandbox: str
) -> None:
    """The log writer is in the workload's process group: the stop's SIGTERM reaches it too, and
    it must outlive the workload's last words."""
    command = 'trap "sleep 0.3; echo checkpoint written; exit 0" TERM; echo ready; while :; do sleep 0.05; done'
    backend = start(backends, tmp_path, command, sandbox)
    wait_for(lambda: backend.logs(0)[0] == b"ready\n")

    backend.stop(grace_s=10)

    log = backend.logs(0)[0]  # bash also says its sleep was terminated
    assert log.startswith(b"ready\n") and log.endswith(b"\ncheckpoint written\n")
    assert backend.get_state()["killed"]["signal"] == signal.SIGTERM  # no escalation was needed
    assert backend.poll().exit_code == 0
