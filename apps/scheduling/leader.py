"""The scheduler loop's lock: however many loops run (replicas of a Deployment, a rolling update's old and
new pod), one runs rounds and the others wait.

A PostgreSQL session-level advisory lock, held on a connection of the loop's own (never one of the pool's,
which another thread could be handed) for as long as the loop leads. A loop that does not get it waits,
says so in its log once, with who holds it, and tries again every ``poll_s``. PostgreSQL drops the lock
when the leader's session ends, however it ends (a stop, a crash, a lost node once TCP keepalives give up
on it), so a waiting loop takes over within ``poll_s`` of that. Before each round the leader asks whether
its session still holds the lock (a database restart ends it); if not, it stops running rounds and waits
like the others. A scheduling cycle also takes a lock of its own (``adapter.run_cycle``), so two cycles
never overlap even in the instant a leader has lost its session and not yet noticed.

On SQLite (the embedded portal) there is nothing to hold: one portal runs per data directory
(``portal/embedded.py``), and so one loop.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
from typing import Any

import psycopg
from django.db import connections

logger = logging.getLogger(__name__)

# Any fixed number that no other advisory lock of the portal uses (adapter's cycle lock is 7_400_113).
LOOP_LOCK_ID = 7_400_114
# pg_locks lists every database's locks; an advisory lock is one database's.
_HOLDER = (
    "SELECT a.application_name, l.pid FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
    "WHERE l.locktype = 'advisory' AND l.classid = 0 AND l.objid = %s AND l.objsubid = 1 AND l.granted "
    "AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())"
)


class LoopLock:
    """The lock one scheduler loop holds while it runs rounds: ``acquire`` waits for it, ``held`` says whether
    it is still held, ``release`` gives it up."""

    def __init__(self, *, lock_id: int = LOOP_LOCK_ID, poll_s: float = 1.0, alias: str = "default") -> None:
        self.lock_id, self.poll_s, self.alias = lock_id, poll_s, alias
        self.name = f"gpuportal-scheduler {socket.gethostname()} pid {os.getpid()}"
        self._connection: psycopg.Connection[Any] | None = None

    @property
    def needed(self) -> bool:
        return connections[self.alias].vendor == "postgresql"

    def acquire(self, stop: threading.Event) -> bool:
        """Wait until this loop holds the lock (True), or until ``stop`` is set (False)."""
        if not self.needed:
            return True
        said_who = None
        while not stop.is_set():
            try:
                if self._try_lock():
                    logger.info("%s holds the scheduler loop's lock: it runs the rounds", self.name)
                    return True
                holder = self._holder()
                if holder != said_who:
                    logger.info("The scheduler loop's lock is held by %s: waiting for it", holder or "another loop")
                    said_who = holder
            except psycopg.Error as exc:
                logger.warning("The scheduler loop's lock cannot be asked for (%s): trying again", exc)
                self._close()
            stop.wait(self.poll_s)
        return False

    def held(self) -> bool:
        """Whether this loop's session is alive and holds the lock."""
        if not self.needed:
            return True
        if self._connection is None:
            return False
        try:
            row = self._connection.execute(_HOLDER + " AND l.pid = pg_backend_pid()", [self.lock_id]).fetchone()
        except psycopg.Error:
            self._close()
            return False
        return row is not None

    def release(self) -> None:
        """Give the lock up (closing the session does it too), so that a waiting loop takes over at once."""
        if self._connection is not None:
            with contextlib.suppress(psycopg.Error):
                self._connection.execute("SELECT pg_advisory_unlock(%s)", [self.lock_id])
            self._close()

    def _try_lock(self) -> bool:
        if self._connection is None or self._connection.closed:
            params = connections[self.alias].get_connection_params()
            params.update(
                autocommit=True,
                application_name=self.name[:63],
                # A leader whose node is lost: its session ends, and the lock with it, once these give up.
                keepalives=1,
                keepalives_idle=10,
                keepalives_interval=5,
                keepalives_count=3,
            )
            self._connection = psycopg.connect(**params)
        row = self._connection.execute("SELECT pg_try_advisory_lock(%s)", [self.lock_id]).fetchone()
        return bool(row and row[0])

    def _holder(self) -> str:
        assert self._connection is not None
        row = self._connection.execute(_HOLDER, [self.lock_id]).fetchone()
        if row is None:
            return ""
        name, pid = row
        return f"{name or 'a session'} (database session {pid})"

    def _close(self) -> None:
        if self._connection is not None:
            with contextlib.suppress(psycopg.Error):
                self._connection.close()
            self._connection = None
