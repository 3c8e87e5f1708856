"""The measurements of bench/inference.py, as pytest cases: they reuse the suite's fixtures (the live
portal behind the notebook proxy, the committed world, the workload host turned in-process).

Not collected by the suite (its name does not start with ``test_`` and it lies outside ``tests/``);
bench/inference.py runs it and reads what it writes to ``$BENCH_INFERENCE_OUT`` (JSON).
``test_the_test_servers_nagle`` is a diagnosis of the test server itself (Nagle's algorithm on its
sockets), not a figure of the portal's.
"""

from __future__ import annotations

import cProfile
import io
import json
import os
import pstats
import random
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from django.db import connection
from django.test import Client
from django.test.testcases import QuietWSGIRequestHandler
from inference import compare, openai_client, request_body, summary

from apps.inference.models import Endpoint, Replica, ScaleEvent

# The suite's fixtures, as tests/conftest.py gives them to the tests.
from tests.conftest import (  # noqa: F401
    _fast_password_hashing,
    _fresh_reconcile_backoff,
    _no_disk_outlives_the_test,
    _plain_static_files,
    _scheduler_runs_inline,
    proxy,
    tx_world,
)
from tests.inference.endpoints import cpu_profile, endpoint
from tests.inference.serving import serving, turn, turn_until
from tests.inference.test_serving import endpoint_token, work  # noqa: F401 (a fixture)
from tests.personas import World
from tests.proxy import Proxy

# The scheduler loop's period: PORTAL_SCHEDULER_INTERVAL_S's default (the loop waits this long
# after each cycle, as run_scheduler does).
LOOP_PERIOD_S = float(os.environ.get("BENCH_LOOP_PERIOD_S", "2"))
SECONDS = float(os.environ.get("BENCH_SECONDS", "15"))
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "3"))
CLIENTS = [int(n) for n in os.environ.get("BENCH_CLIENTS", "1,4,8").split(",")]
TOKENS = [int(n) for n in os.environ.get("BENCH_TOKENS", "16,256").split(",")]
COLD_RUNS = int(os.environ.get("BENCH_COLD_RUNS", "3"))
WARM_RUNS = int(os.environ.get("BENCH_WARM_RUNS", "30"))


def _record(key: str, value: Any) -> None:
    out = Path(os.environ.get("BENCH_INFERENCE_OUT", "bench/out/inference.json"))
    out.parent.mkdir(parents=True, exist_ok=True)
    found = json.loads(out.read_text()) if out.exists() else {}
    found[key] = value
    out.write_text(json.dumps(found, indent=2))


@contextmanager
def scheduler_loop(period_s: float = LOOP_PERIOD_S) -> Iterator[list[float]]:
    """The portal's loop in a thread: a turn, then ``period_s`` of rest, as run_scheduler waits its
    interval after each cycle. Yields the turns' durations."""
    stop = threading.Event()
    durations: list[float] = []

    def run() -> None:
        try:
            while not stop.is_set():
                began = time.monotonic()
                try:
                    turn()
                except Exception as exc:  # a turn that lost a race with the web thread: the next one
                    print(f"turn failed: {exc!r}")
                durations.append(time.monotonic() - began)
                stop.wait(period_s)
        finally:
            connection.close()

    thread = threading.Thread(target=run, name="scheduler-loop", daemon=True)
    thread.start()
    try:
        yield durations
    finally:
        stop.set()
        thread.join(timeout=120)


# -- the cases -----------------------------------------------------------------------------------


def test_throughput_and_latency(tx_world: World, proxy: Proxy, work: Path, live_server: Any) -> None:  # noqa: F811
    """The same requests at the same concurrency to the replica itself, to the portal (its Django
    server, the endpoint proxy), and through the notebook proxy in front of it."""
    world = tx_world
    profile = cpu_profile(concurrency=max(CLIENTS))
    made = endpoint(world.team_a, world.alice, profile, min_replicas=1, max_replicas=1)
    with scheduler_loop():
        replica = turn_until(lambda: serving(made), step_s=LOOP_PERIOD_S)[0]
        token = endpoint_token(world.alice, made)
        paths = {
            "direct": lambda: openai_client(replica.proxy_target, replica.api_key),
            "portal": lambda: openai_client(live_server.url, token, made.host),
            "proxy": lambda: openai_client(proxy.url, token, made.host),
        }
        rows = []
        for max_tokens in TOKENS:
            for clients in CLIENTS:
                rows += compare(paths, request_body(made.name, max_tokens), clients, SECONDS, ROUNDS)
                _record("throughput", rows)
    assert all(row["errors"] == 0 for row in rows), [row["first_errors"] for row in rows if row["errors"]]


def test_first_answer_cold_and_warm(tx_world: World, proxy: Proxy, work: Path) -> None:  # noqa: F811
    """Warm: a request to a serving replica, answered whole (16 tokens) and its first streamed
    event. Cold: the endpoint scaled to zero; the request starts a replica and waits for it while
    the scheduler loop turns on its period."""
    world = tx_world
    made = endpoint(world.team_a, world.alice, cpu_profile(), min_replicas=1, max_replicas=1, scale_to_zero_s=60)
    token = endpoint_token(world.alice, made)
    result: dict[str, Any] = {"loop_period_s": LOOP_PERIOD_S}
    with scheduler_loop() as turns:
        turn_until(lambda: serving(made), step_s=LOOP_PERIOD_S)
        whole, first_event = [], []
        with openai_client(proxy.url, token, made.host) as http:
            http.post("/chat/completions", json=request_body(made.name, 16))
            for _ in range(WARM_RUNS):
                began = time.perf_counter()
                assert http.post("/chat/completions", json=request_body(made.name, 16)).status_code == 200
                whole.append(time.perf_counter() - began)
                began = time.perf_counter()
                with http.stream("POST", "/chat/completions", json=request_body(made.name, 16, stream=True)) as answer:
                    for line in answer.iter_lines():
                        if line.startswith("data: "):
                            first_event.append(time.perf_counter() - began)
                            break
        result["warm_whole_16_tokens"] = summary(whole)
        result["warm_first_streamed_event"] = summary(first_event)

        cold = []
        for _ in range(COLD_RUNS):
            Endpoint.objects.filter(pk=made.pk).update(last_request_at=made.created_at.replace(year=2020))
            turn_until(lambda: not serving(made) and not Replica.objects.filter(
                endpoint=made).exclude(state__in=Replica.FINAL_STATES).exists(), step_s=0.5)  # fmt: skip
            time.sleep(random.uniform(0, LOOP_PERIOD_S))  # any phase of the loop
            sent = time.time()
            began = time.perf_counter()
            with openai_client(proxy.url, token, made.host) as http:
                answer = http.post(
                    "/chat/completions", json=request_body(made.name, 16), headers={"Prefer": "wait=300"}
                )
            took = time.perf_counter() - began
            assert answer.status_code == 200, answer.text
            replica = Replica.objects.filter(endpoint=made).order_by("-pk").first()
            assert replica is not None and replica.created_at.timestamp() > sent
            cold.append({
                "answer_s": took,
                "to_replica_created_s": replica.created_at.timestamp() - sent,
                "to_admitted_s": replica.admitted_at.timestamp() - sent if replica.admitted_at else None,
                "to_started_s": replica.started_at.timestamp() - sent if replica.started_at else None,
            })  # fmt: skip
            print(json.dumps(cold[-1]))
        result["cold"] = cold
        result["cold_answer_s"] = summary([run["answer_s"] for run in cold])
        result["turn_s"] = summary(turns)
    _record("first_answer", result)


def test_scale_up(tx_world: World, proxy: Proxy, work: Path) -> None:  # noqa: F811
    """One replica serving one request at a time (concurrency 1, at most 2 replicas); four clients
    start calling at once, so that from their first requests on three wait: from then to the
    autoscaler's decision, the second replica's start and its first answer."""
    world = tx_world
    after_s = int(os.environ.get("BENCH_SCALE_UP_AFTER_S", "5"))
    profile = cpu_profile(concurrency=1, scale_up_after_s=after_s, scale_down_after_s=5)
    made = endpoint(world.team_a, world.alice, profile, min_replicas=1, max_replicas=2)
    token = endpoint_token(world.alice, made)
    body = request_body(made.name, 256)
    runs = []
    with scheduler_loop() as turns:
        for _ in range(int(os.environ.get("BENCH_SCALE_UP_RUNS", "2"))):
            turn_until(lambda: len(serving(made)) == 1, step_s=LOOP_PERIOD_S)
            first = serving(made)[0]
            stop = threading.Event()
            served: list[float] = []

            def load(stop: threading.Event, served: list[float]) -> None:
                with openai_client(proxy.url, token, made.host) as http:
                    while not stop.is_set():
                        assert http.post("/chat/completions", json=body).status_code == 200
                        served.append(time.time())

            sent = time.time()
            clients = [threading.Thread(target=load, args=(stop, served), daemon=True) for _ in range(4)]
            for client in clients:
                client.start()
            try:
                deadline = time.monotonic() + 120
                while True:
                    second = (
                        Replica.objects.filter(endpoint=made, state=Replica.State.READY).exclude(pk=first.pk).first()
                    )
                    if second is not None:
                        break
                    assert time.monotonic() < deadline, "no second replica"
                    time.sleep(0.05)
                seen_ready = time.time()
                # Once the proxy reads the replicas again (at most a second), two answers at once.
                time.sleep(3)
            finally:
                stop.set()
                for client in clients:
                    client.join(timeout=120)
            event = ScaleEvent.objects.filter(endpoint=made, to_replicas=2).order_by("-pk").first()
            assert event is not None and event.at.timestamp() >= sent - 1
            after = [at for at in served if at > seen_ready]
            runs.append({
                "scale_up_after_s": after_s,
                "to_decision_s": event.at.timestamp() - sent,
                "to_replica_created_s": second.created_at.timestamp() - sent,
                "to_admitted_s": second.admitted_at.timestamp() - sent if second.admitted_at else None,
                "to_started_s": second.started_at.timestamp() - sent if second.started_at else None,
                "to_seen_ready_s": seen_ready - sent,
                "answers_a_second_before": sum(1 for at in served if sent + 1 < at <= second.started_at.timestamp())
                / max(0.001, second.started_at.timestamp() - sent - 1),
                "answers_a_second_after": len(after) / 3.0,
            })  # fmt: skip
            print(json.dumps(runs[-1]))
            stop_extra = time.monotonic() + 120
            while len(serving(made)) != 1 or Replica.objects.filter(endpoint=made).exclude(
                    state__in=Replica.FINAL_STATES).count() != 1:  # fmt: skip
                assert time.monotonic() < stop_extra, "did not scale back down"
                time.sleep(0.5)
    _record("scale_up", {"loop_period_s": LOOP_PERIOD_S, "runs": runs, "turn_s": summary(turns)})


@contextmanager
def _queries() -> Iterator[list[str]]:
    """The SQL this thread sends meanwhile (over reconnections: the proxy gives its connection back
    before streaming the answer)."""
    sent: list[str] = []

    def wrapper(execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any) -> Any:
        sent.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(wrapper):
        yield sent


def test_where_a_request_goes(tx_world: World, proxy: Proxy, work: Path) -> None:  # noqa: F811
    """The portal's part of a request, in-process (Django's test client, no network to the
    portal): SQL queries per request, and a profile of where the time goes."""
    world = tx_world
    made = endpoint(world.team_a, world.alice, cpu_profile(), min_replicas=1, max_replicas=1)
    turn_until(lambda: serving(made), step_s=0.5)
    token = endpoint_token(world.alice, made)
    web = Client(HTTP_HOST=made.host, HTTP_AUTHORIZATION=f"Bearer {token}")
    payload = json.dumps(request_body(made.name, 16))

    def call() -> None:
        answer = web.post("/v1/chat/completions", data=payload, content_type="application/json")
        assert answer.status_code == 200
        b"".join(answer.streaming_content)
        answer.close()

    for _ in range(5):
        call()
    time.sleep(1.2)  # past the replicas' cache: the next request reads them as one a second does
    with _queries() as per_request:
        call()
    with _queries() as cached:
        call()
    timed = []
    for _ in range(100):
        began = time.perf_counter()
        call()
        timed.append(time.perf_counter() - began)
    replica = serving(made)[0]
    direct = []
    with openai_client(replica.proxy_target, replica.api_key) as http:
        for _ in range(100):
            began = time.perf_counter()
            assert (
                http.post(
                    "/chat/completions", content=payload, headers={"Content-Type": "application/json"}
                ).status_code
                == 200
            )
            direct.append(time.perf_counter() - began)
    runs = 200
    profiler = cProfile.Profile()
    began = time.perf_counter()
    profiler.enable()
    for _ in range(runs):
        call()
    profiler.disable()
    wall = (time.perf_counter() - began) / runs
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(45)
    _record("in_process", {
        "queries_first_in_a_second": per_request, "queries_cached": cached,
        "profiled_ms_per_request": wall * 1000, "timed": summary(timed), "direct": summary(direct),
        "profile": text.getvalue(),
    })  # fmt: skip
    print(text.getvalue())


def test_the_test_servers_nagle(tx_world: World, proxy: Proxy, work: Path, live_server: Any) -> None:  # noqa: F811
    """Diagnosis: the portal's path with the test server's sockets as they are (Nagle's algorithm
    on: the wsgiref server writes the status line, the headers and the body in separate sends) and
    with TCP_NODELAY, taking turns."""
    world = tx_world
    made = endpoint(world.team_a, world.alice, cpu_profile(concurrency=8), min_replicas=1, max_replicas=1)
    # The same on an endpoint whose replicas take 2 requests at once (the test profile's default).
    other = endpoint(world.team_a, world.alice, cpu_profile("llama-2"), name="two", min_replicas=1, max_replicas=1)
    with scheduler_loop():
        turn_until(lambda: serving(made) and serving(other), step_s=LOOP_PERIOD_S)
        replica = serving(made)[0]
        token, other_token = endpoint_token(world.alice, made), endpoint_token(world.alice, other)

        def portal(nodelay: bool) -> Any:
            QuietWSGIRequestHandler.disable_nagle_algorithm = nodelay  # read as each connection is accepted
            return openai_client(live_server.url, token, made.host)

        paths = {
            "direct": lambda: openai_client(replica.proxy_target, replica.api_key),
            "portal": lambda: portal(False),
            "portal_nodelay": lambda: portal(True),
            "portal_concurrency_2": lambda: openai_client(live_server.url, other_token, other.host),
        }
        rows = []
        try:
            for clients in CLIENTS:
                rows += compare(paths, request_body(made.name, 16), clients, SECONDS, ROUNDS)
                _record("nagle", rows)
        finally:
            QuietWSGIRequestHandler.disable_nagle_algorithm = False
