"""The embedded broker under a burst: many threads and processes send at once while the worker's
side reads. Every message arrives whole, exactly once (kombu's own filesystem transport let a
reader take a file before it was fully written: a half message, or none)."""

from __future__ import annotations

import multiprocessing
import threading
import time
from pathlib import Path
from typing import Any

from kombu import Connection

import portal.broker  # noqa: F401  (registers the atomicfs transport)

THREADS, PROCESSES, EACH = 6, 2, 250


def _options(folder: Path) -> dict[str, Any]:
    (folder / "queue").mkdir(parents=True, exist_ok=True)
    queue = str(folder / "queue")
    return {"data_folder_in": queue, "data_folder_out": queue, "control_folder": str(folder / "control"),
            "store_processed": False, "polling_interval": 0.001}  # fmt: skip


def _produce(folder: Path, sender: str) -> None:
    with Connection("atomicfs://localhost//", transport_options=_options(folder)) as connection:
        queue = connection.SimpleQueue("burst")
        for n in range(EACH):
            queue.put({"sender": sender, "n": n, "padding": "x" * 20_000})  # big enough to be written in parts


def test_a_burst_of_concurrent_senders_loses_and_breaks_no_message(tmp_path: Path) -> None:
    # Processes first: forking while this process's sender threads hold locks could deadlock a child.
    context = multiprocessing.get_context("fork")
    senders: list[Any] = [context.Process(target=_produce, args=(tmp_path, f"process-{i}")) for i in range(PROCESSES)]
    senders += [threading.Thread(target=_produce, args=(tmp_path, f"thread-{i}")) for i in range(THREADS)]
    for sender in senders:
        sender.start()
    received: list[tuple[str, int]] = []
    errors: list[str] = []
    total = (THREADS + PROCESSES) * EACH
    with Connection("atomicfs://localhost//", transport_options=_options(tmp_path)) as connection:
        queue = connection.SimpleQueue("burst")
        deadline = time.monotonic() + 120
        while len(received) + len(errors) < total and time.monotonic() < deadline:
            try:
                message = queue.get(timeout=1)
            except queue.Empty:
                continue
            except Exception as exc:  # what a half-written message raised (JSONDecodeError)
                errors.append(repr(exc))
                continue
            received.append((message.payload["sender"], message.payload["n"]))
            message.ack()
    for sender in senders:
        sender.join()

    assert errors == []
    assert len(received) == total and len(set(received)) == total
    assert not list((tmp_path / "staging").iterdir())  # nothing left half-way
