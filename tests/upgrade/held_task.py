"""A task for tests/upgrade/test_worker_lost.py, which the workers it starts load besides the
portal's: each run notes its process in a file; the first run then holds on, for the test to kill
its worker in the middle, and a later one ends at once."""

from __future__ import annotations

import os
import time
from pathlib import Path

from celery import shared_task


@shared_task(name="tests.upgrade.held")
def held(notes: str) -> None:
    path = Path(notes)
    with path.open("a") as out:
        out.write(f"started {os.getpid()}\n")
    if path.read_text().count("started") == 1:
        time.sleep(120)
    with path.open("a") as out:
        out.write(f"ended {os.getpid()}\n")
