"""A workload's log with a size cap: the writer that keeps its most recent part, and how to read it.

The local backend's wrapper pipes a replica's output (stdout and stderr) into this module, run as
a script by the portal's own interpreter in isolated mode (``python -I logcap.py LOG MAX_BYTES``),
outside the sandbox. It appends to ``LOG``; once the file passes ``MAX_BYTES`` it puts in its
place a file holding a marker line, ``[portal] log truncated: N bytes dropped``, and the most
recent half of the output (from the start of a line where one begins near the cut). So a job
that writes as fast as it can fills at most ``MAX_BYTES`` (and one read's worth) of the portal's
run directory, and the log's last lines are always there.

Offsets into a log count the bytes the workload wrote, not the bytes of the file: a log whose
older part was dropped starts at offset N (the number in its marker). So an offset handed to a
reader stays good across a rewrite (``workers/backends/files.py`` ``read_log``): readers that
follow a log see no shrink, and one that fell behind gets the marker and what is kept.

The writer ignores SIGTERM, SIGINT and SIGHUP: a stop signals the whole process group, and the
writer must drain the pipe to its end (the workload's last lines) rather than die with it. It
ends at end of file, once every process of the workload has closed its output, or by SIGKILL.

This file runs on its own, with nothing but the standard library (isolated mode ignores
``PYTHONPATH`` and the working directory).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import sys
from typing import BinaryIO

MARKER = b"[portal] log truncated: %d bytes dropped\n"
#: The marker, at the start of a file only; at most 18 digits, so an offset stays below 2**62.
MARKER_PATTERN = re.compile(rb"\[portal\] log truncated: (\d{1,18}) bytes dropped\n")
MARKER_MAX_LEN = 64
#: How far past the cut the kept part may start so that it starts with a whole line.
LINE_LOOKAHEAD = 64 << 10
READ_SIZE = 64 << 10
#: The smallest cap: below it the marker and a line or two would not fit.
MIN_MAX_BYTES = 64 << 10


def read_marker(log: BinaryIO) -> tuple[int, int]:
    """(bytes dropped, length of the marker line) of an open log; (0, 0) where nothing was
    dropped. Leaves the file positioned at its start."""
    log.seek(0)
    head = log.read(MARKER_MAX_LEN)
    log.seek(0)
    found = MARKER_PATTERN.match(head)
    return (int(found.group(1)), found.end()) if found else (0, 0)


class CappedLog:
    """Appends to a log file, keeping it under ``max_bytes`` (plus one write) by dropping its
    oldest part. The file is replaced, never rewritten in place: a reader that has it open reads
    one consistent version."""

    def __init__(self, path: str, max_bytes: int) -> None:
        self.path = path
        self.max_bytes = max(max_bytes, MIN_MAX_BYTES)
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with open(path, "rb") as log:
            self.dropped, self.header = read_marker(log)
        self.size = os.fstat(self.fd).st_size

    def write(self, data: bytes) -> None:
        """Append ``data``; drop the oldest part once the file passes the cap."""
        view = memoryview(data)
        while view:
            written = os.write(self.fd, view)
            view = view[written:]
        self.size += len(data)
        if self.size > self.max_bytes:
            self._drop_oldest()

    def _drop_oldest(self) -> None:
        """Replace the file with the marker and the last half of the output, from a line's start."""
        partial = f"{self.path}.tmp"
        with open(self.path, "rb") as old:
            cut = self._cut(old)
            dropped = self.dropped + cut - self.header
            marker = MARKER % dropped
            if os.path.lexists(partial):
                os.unlink(partial)
            fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                os.write(fd, marker)
                kept = _copy_range(old.fileno(), fd, cut, self.size - cut)
                os.replace(partial, self.path)
            except OSError:
                os.close(fd)
                os.unlink(partial)
                raise
        os.close(self.fd)
        self.fd, self.dropped, self.header = fd, dropped, len(marker)
        self.size = self.header + kept

    def _cut(self, old: BinaryIO) -> int:
        """Where the kept part starts: half the cap before the end, moved to the next line's start
        where one begins soon after."""
        cut = self.size - self.max_bytes // 2
        old.seek(cut)
        newline = old.read(LINE_LOOKAHEAD).find(b"\n")
        return cut + newline + 1 if newline >= 0 and cut + newline + 1 < self.size else cut

    def close(self) -> None:
        os.close(self.fd)


def _copy_range(source: int, target: int, offset: int, count: int) -> int:
    """Copy ``count`` bytes of ``source`` from ``offset`` to the end of ``target``; return how many."""
    copied = 0
    while copied < count:
        sent = os.sendfile(target, source, offset + copied, count - copied)
        if not sent:
            break
        copied += sent
    return copied


def drain(source: int, log: CappedLog) -> None:
    """Copy ``source`` into ``log`` until end of file. Where the log cannot be written (a full
    disk), keep reading and drop: a workload must never die for its log."""
    writable = True
    while chunk := os.read(source, READ_SIZE):
        if writable:
            try:
                log.write(chunk)
            except OSError as exc:
                writable = False
                with contextlib.suppress(OSError):  # the wrapper's own output, where the log was
                    print(f"[portal] log not written from here on: {exc}", file=sys.stderr)


def main(argv: list[str]) -> int:
    """``logcap.py LOG MAX_BYTES``: standard input into ``LOG``, capped at ``MAX_BYTES``."""
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    if len(argv) != 3 or not argv[2].isdigit():
        print("usage: logcap.py LOG MAX_BYTES", file=sys.stderr)
        return 2
    log = CappedLog(argv[1], int(argv[2]))
    try:
        drain(sys.stdin.fileno(), log)
    finally:
        log.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
