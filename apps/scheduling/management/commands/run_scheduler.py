import logging
import signal
import threading
import time
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand
from django.db import close_old_connections

from apps.elastic import scaling as elastic
from apps.inference import scaling
from apps.inventory import maintenance
from apps.monitoring.cycles import timed_cycle
from apps.provisioning import actions as provisioning
from apps.provisioning import clusters as provisioned
from apps.scheduling import whatif
from apps.scheduling.adapter import requeue_unready_gangs
from apps.scheduling.leader import LoopLock
from apps.telemetry import record as telemetry
from apps.workloads.host import SWEEP_EVERY_S, reconcile
from apps.workspaces import disks
from apps.workspaces.live import HEARTBEAT_S, heartbeat

logger = logging.getLogger(__name__)


class Command(BaseCommand):
    help = (
        "Run the scheduler loop until SIGINT or SIGTERM: every --interval seconds, reconcile jobs with "
        "their backends, requeue gangs not ready in time, read the GPUs' telemetry when due, scale inference "
        "endpoints, begin and end GPU reservations and maintenance windows, run a scheduling cycle, and grow "
        "or shrink elastic node pools; every 5 seconds "
        "send open pages the live-update heartbeat that tells them updates reach them, and keep up the "
        "workspaces' disks on this machine. However many loops run, one runs rounds: the others wait for "
        "the scheduler loop's lock (apps/scheduling/leader.py) and take over when its holder stops."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--interval", type=float, default=settings.PORTAL_SCHEDULER_INTERVAL_S)
        parser.add_argument(
            "--once", action="store_true", help="Run one cycle and exit, without waiting for the loop's lock."
        )

    def handle(self, *args: Any, interval: float, once: bool, **options: Any) -> None:
        stop = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
        lock = LoopLock()
        if not once and not lock.acquire(stop):
            return
        if not once:
            # Open pages say "Live" while these beats arrive: a thread of its own keeps them
            # regular whatever the interval and however long a cycle takes.
            threading.Thread(target=self._beat, args=(stop,), name="live-heartbeat", daemon=True).start()
            # The workspaces' disks on this machine (mounts, quota changes, measurements) in a thread
            # of their own: resizing or measuring one never holds up a cycle.
            threading.Thread(target=disks.keep_up, args=(stop,), name="workspace-disks", daemon=True).start()
        try:
            self._loop(stop, lock, interval=interval, once=once)
        finally:
            lock.release()

    def _loop(self, stop: threading.Event, lock: LoopLock, *, interval: float, once: bool) -> None:
        last_sweep = -SWEEP_EVERY_S
        while not stop.is_set():
            if not once and not lock.held():
                logger.warning("This scheduler loop lost its lock (its database session ended): waiting for it")
                if not lock.acquire(stop):
                    return
            close_old_connections()
            try:
                sweep = time.monotonic() - last_sweep >= SWEEP_EVERY_S
                reconcile(sweep=sweep)
                if sweep:
                    last_sweep = time.monotonic()
                requeue_unready_gangs()
                telemetry.upkeep()
                whatif.upkeep()
                scaling.upkeep()
                provisioning.upkeep()
                provisioned.keep_up()
                maintenance.upkeep()  # windows begun and ended, drains done: before the cycle places work
                result = timed_cycle()
                elastic.upkeep()  # after the cycle: what still waits is what more nodes are for
                if once:
                    self.stdout.write(f"admitted {len(result.admitted)}, pending {result.pending}")
            except Exception:  # one failed cycle must not stop the loop; the next one retries
                logger.exception("scheduling cycle failed")
            if once:
                return
            stop.wait(interval)

    @staticmethod
    def _beat(stop: threading.Event) -> None:
        while not stop.is_set():
            heartbeat()
            stop.wait(HEARTBEAT_S)
