"""Inference endpoints for real: first answer cold and warm, throughput and latency through the
portal against the replica's server directly, and scale-up time.

    DATABASE_URL=postgres://... REDIS_URL=redis://... .venv/bin/python bench/inference.py
        [--json bench/out/inference.json] [--seconds 15] [--rounds 3] [--clients 1,4,8] [--tokens 16,256]
        [--cold-runs 3] [--loop-period-s 2] [--scale-up-after-s 5] [-k EXPR] [--embedded | --only-embedded]

The measurements are pytest cases (bench/inference_cases.py) on the suite's fixtures: the live
portal (Django's threaded development server, in this process) behind the notebook proxy
(configurable-http-proxy), llama.cpp's server serving the tiny model of
tests/inference/tinymodel.py in its sandbox, and the portal's loop (autoscaler, scheduler,
workload host) turned in a thread every ``--loop-period-s`` as run_scheduler turns it. Three
paths carry the same requests at the same concurrency: ``direct`` (the replica's Unix socket with
its key), ``portal`` (the portal's server, the endpoint proxy) and ``proxy`` (the notebook proxy in
front of that: what clients use). PostgreSQL connections come from a pool (DATABASE_POOL_MAX, 10
unless set), as in production.

With ``--embedded`` (or ``--only-embedded``), then the same throughput runs and cold starts through
the embedded portal as deploy/run.sh runs it (bench/embedded.py's ``Portal``: Daphne, the ASGI
server, behind the notebook proxy; Celery workers; the scheduler loop every 2 s; SQLite in its
data directory), its endpoint made in ``manage.py shell``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import httpx

ROOT = Path(__file__).resolve().parent.parent

EOS = 2  # the tiny model's end-of-sequence token: forbidden, so every answer is max_tokens long


def request_body(name: str, max_tokens: int, stream: bool = False) -> dict[str, Any]:
    """A short chat completion of exactly ``max_tokens`` tokens (greedy, end of sequence forbidden)."""
    return {
        "model": name, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": max_tokens,
        "temperature": 0, "logit_bias": {str(EOS): -100}, "stream": stream,
    }  # fmt: skip


def summary(seconds: list[float]) -> dict[str, float]:
    ordered = sorted(seconds)
    at = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return {"n": len(ordered), "mean_ms": statistics.fmean(ordered) * 1000, "p50_ms": at(0.5) * 1000,
            "p95_ms": at(0.95) * 1000, "min_ms": ordered[0] * 1000, "max_ms": ordered[-1] * 1000}  # fmt: skip


def openai_client(base: str, token: str, host: str = "", timeout_s: float = 300.0) -> httpx.Client:
    """A client of an endpoint's OpenAI API: at ``base`` (``http://127.0.0.1:<port>``) with the
    endpoint's ``host`` name, or, with ``base`` an ``http+unix://`` target, a replica's own socket."""
    parts = urlsplit(base)
    if parts.scheme == "http+unix":
        transport = httpx.HTTPTransport(uds=unquote(parts.netloc))
        return httpx.Client(transport=transport, base_url="http://replica/v1",
                            headers={"Authorization": f"Bearer {token}"}, timeout=timeout_s)  # fmt: skip
    return httpx.Client(
        base_url=f"http://127.0.0.1:{parts.port}/v1",
        headers={"Authorization": f"Bearer {token}", "Host": f"{host}:{parts.port}"},
        timeout=timeout_s,
    )


def drive(make: Callable[[], httpx.Client], body: dict[str, Any], clients: int, seconds: float) -> dict[str, Any]:
    """``clients`` clients, each calling in a loop for ``seconds`` (after one untimed call each):
    the latencies of the answers, their completion tokens, the errors."""
    latencies: list[float] = []
    tokens: list[int] = []
    errors: list[str] = []
    lock = threading.Lock()
    barrier = threading.Barrier(clients + 1)
    window: dict[str, float] = {}

    def run() -> None:
        with make() as http:
            http.post("/chat/completions", json=body)
            barrier.wait()
            while time.monotonic() < window["end"]:
                began = time.perf_counter()
                try:
                    answer = http.post("/chat/completions", json=body)
                except httpx.HTTPError as exc:
                    with lock:
                        errors.append(repr(exc))
                    continue
                took = time.perf_counter() - began
                with lock:
                    if answer.status_code == 200:
                        latencies.append(took)
                        tokens.append(answer.json()["usage"]["completion_tokens"])
                    else:
                        errors.append(f"{answer.status_code} {answer.text[:200]}")

    threads = [threading.Thread(target=run, daemon=True) for _ in range(clients)]
    for thread in threads:
        thread.start()
    window["end"] = time.monotonic() + 3600
    barrier.wait()
    began = time.monotonic()
    window["end"] = began + seconds
    for thread in threads:
        thread.join()
    return {"wall_s": time.monotonic() - began, "latencies": latencies, "tokens": tokens, "errors": errors}


def compare(
    paths: dict[str, Callable[[], httpx.Client]], body: dict[str, Any], clients: int, seconds: float, rounds: int = 3
) -> list[dict[str, Any]]:
    """The same requests on every path at the same concurrency: ``rounds`` turns of ``seconds /
    rounds`` each, the paths in a rotating order, so that a change in the machine's load over the
    run weighs on all of them alike."""
    runs: dict[str, list[dict[str, Any]]] = {path: [] for path in paths}
    order = list(paths)
    for turn in range(rounds):
        for path in order[turn % len(order) :] + order[: turn % len(order)]:
            runs[path].append(drive(paths[path], body, clients, seconds / rounds))
    rows = []
    for path, done in runs.items():
        latencies = [s for run in done for s in run["latencies"]]
        tokens = [n for run in done for n in run["tokens"]]
        wall = sum(run["wall_s"] for run in done)
        errors = [e for run in done for e in run["errors"]]
        rows.append({
            "path": path, "max_tokens": body["max_tokens"], "clients": clients, "wall_s": wall,
            "requests": len(latencies), "rps": len(latencies) / wall, "errors": len(errors),
            "first_errors": errors[:3], "rps_per_round": [len(run["latencies"]) / run["wall_s"] for run in done],
            "completion_tokens_mean": statistics.fmean(tokens) if tokens else 0, **summary(latencies or [0.0]),
        })  # fmt: skip
        print(json.dumps(rows[-1]))
    return rows


# -- the embedded portal (deploy/run.sh: Daphne behind the notebook proxy, Celery, the scheduler loop)

SETUP = """
import json
from pathlib import Path
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from apps.accounts.api_tokens import do_create_token
from apps.catalog.models import InferenceProfile
from apps.inference.actions import check_create_endpoint
from apps.workspaces.models import Workspace
from tests.inference.tinymodel import write_tiny_gguf
admin = get_user_model().objects.get(username="admin")
group = Group.objects.create(name="bench")
admin.groups.add(group)
workspace = Workspace.objects.create(name="bench", assignee_kind=Workspace.Assignee.TEAM, assigned_group=group,
                                     cpu_cores=64, memory_gb=256)
model = Path(settings.PORTAL_WORK_DIR) / workspace.name / "models" / "tiny.gguf"
model.parent.mkdir(parents=True, exist_ok=True)
write_tiny_gguf(model)
profile = InferenceProfile.objects.create(name="bench-cpu", server="llamacpp", cpu_cores=1, memory_gb=2,
                                          concurrency=CONCURRENCY, published=True)
made = check_create_endpoint(workspace, name="chat", profile=profile, acting_user=admin, path="models/tiny.gguf",
                             min_replicas=1, max_replicas=1, scale_to_zero_s=60)
token = do_create_token(admin, name="bench", expires_in_days=1, endpoint=made, acting_user=admin)[1]
print("BENCH " + json.dumps({"pk": made.pk, "host": made.host, "token": token}))
"""
REPLICA = """
import json
from apps.inference.models import Replica
replica = Replica.objects.filter(endpoint_id=PK, state=Replica.State.READY).first()
print("BENCH " + json.dumps({"target": replica.proxy_target, "key": replica.api_key}))
"""
IDLE = """
import json
from datetime import timedelta
from django.utils import timezone
from apps.inference.models import Endpoint, Replica
Endpoint.objects.filter(pk=PK).update(last_request_at=timezone.now() - timedelta(days=1))
"""
LIVE = """
import json
from apps.inference.models import Replica
live = Replica.objects.filter(endpoint_id=PK).exclude(state__in=Replica.FINAL_STATES).count()
print("BENCH " + json.dumps({"live": live}))
"""


def _shell(portal: Any, code: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", code],
        cwd=ROOT, env=portal.env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    lines = [line for line in done.stdout.splitlines() if line.startswith("BENCH ")]
    if done.returncode or (not lines and "BENCH" in code):
        raise SystemExit(f"manage.py shell failed:\n{done.stdout}\n{done.stderr}")
    return json.loads(lines[-1][6:]) if lines else {}


def embedded(args: argparse.Namespace) -> dict[str, Any]:
    """The same throughput runs (replica directly, notebook proxy -> Daphne -> replica) and cold
    starts, on the embedded portal with its own scheduler loop and workers."""
    sys.path.insert(0, str(ROOT / "bench"))
    from embedded import Portal

    env_dir = Path(os.environ.get("PORTAL_TEST_ENV_DIR", Path.home() / ".cache" / "gpuportal" / "test-envs"))
    clients = [int(n) for n in args.clients.split(",")]
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as data_dir, tempfile.TemporaryDirectory() as work_dir:
        portal = Portal(Path(data_dir), env_dir, Path(work_dir))
        try:
            portal.start()
            made = _shell(portal, SETUP.replace("CONCURRENCY", str(max(clients))))
            began = time.perf_counter()
            with openai_client(portal.url, made["token"], made["host"]) as http:
                first = http.post("/chat/completions", json=request_body("chat", 16), headers={"Prefer": "wait=600"})
            assert first.status_code == 200, first.text
            results["created_to_first_answer_s"] = time.perf_counter() - began
            replica = _shell(portal, REPLICA.replace("PK", str(made["pk"])))
            paths = {
                "direct": lambda: openai_client(replica["target"], replica["key"]),
                "proxy": lambda: openai_client(portal.url, made["token"], made["host"]),
            }
            rows = []
            for max_tokens in [int(n) for n in args.tokens.split(",")]:
                for n in clients:
                    rows += compare(paths, request_body("chat", max_tokens), n, args.seconds, args.rounds)
            results["throughput"] = rows
            cold = []
            for _ in range(args.cold_runs):
                _shell(portal, IDLE.replace("PK", str(made["pk"])))
                deadline = time.monotonic() + 180
                while _shell(portal, LIVE.replace("PK", str(made["pk"])))["live"]:
                    assert time.monotonic() < deadline, "the endpoint did not scale to zero"
                    time.sleep(1)
                time.sleep(random.uniform(0, args.loop_period_s))
                began = time.perf_counter()
                with openai_client(portal.url, made["token"], made["host"]) as http:
                    answer = http.post(
                        "/chat/completions", json=request_body("chat", 16), headers={"Prefer": "wait=300"}
                    )
                assert answer.status_code == 200, answer.text
                cold.append(time.perf_counter() - began)
                print(f"embedded cold start: {cold[-1]:.2f} s")
            results["cold_answer_s"] = cold
        finally:
            portal.stop()
    return results


def _row(found: list[dict[str, Any]], path: str, tokens: int, clients: int) -> dict[str, Any]:
    return next(r for r in found if r["path"] == path and r["max_tokens"] == tokens and r["clients"] == clients)


def report(results: dict[str, Any]) -> None:
    rows = results.get("throughput", [])
    if rows:
        print("\nmax_tokens clients path     req/s   p50 ms   p95 ms   rps ratio  p50 +ms  p50 ratio")
        for tokens in sorted({r["max_tokens"] for r in rows}):
            for clients in sorted({r["clients"] for r in rows}):
                direct = _row(rows, "direct", tokens, clients)
                for path in ("direct", "portal", "proxy"):
                    r = _row(rows, path, tokens, clients)
                    print(f"{tokens:>10} {clients:>7} {path:<7} {r['rps']:>7.1f} {r['p50_ms']:>8.1f}"
                          f" {r['p95_ms']:>8.1f}"
                          f" {direct['rps'] / r['rps']:>10.2f} {r['p50_ms'] - direct['p50_ms']:>8.1f}"
                          f" {r['p50_ms'] / direct['p50_ms']:>10.2f}")  # fmt: skip
    first = results.get("first_answer")
    if first:
        for name in ("warm_whole_16_tokens", "warm_first_streamed_event"):
            s = first[name]
            print(f"{name}: p50 {s['p50_ms']:.1f} ms, p95 {s['p95_ms']:.1f} ms (n={s['n']})")
        for run in first["cold"]:
            print("cold: " + ", ".join(f"{k} {v:.2f}" for k, v in run.items() if v is not None))
    for run in results.get("scale_up", {}).get("runs", []):
        print("scale-up: " + ", ".join(f"{k} {v:.2f}" for k, v in run.items() if v is not None))
    for r in results.get("nagle", []):
        direct = _row(results["nagle"], "direct", r["max_tokens"], r["clients"])
        print(f"test server's Nagle: {r['clients']} clients {r['path']:<15} {r['rps']:>7.1f} req/s,"
              f" p50 {r['p50_ms']:.1f} ms (+{r['p50_ms'] - direct['p50_ms']:.1f})")  # fmt: skip
    outside = results.get("embedded")
    if outside:
        print(f"embedded: endpoint created -> first answer {outside['created_to_first_answer_s']:.2f} s")
        print("embedded: max_tokens clients path     req/s   p50 ms   p95 ms  p50 +ms")
        for r in outside["throughput"]:
            direct = _row(outside["throughput"], "direct", r["max_tokens"], r["clients"])
            print(f"{r['max_tokens']:>20} {r['clients']:>7} {r['path']:<7} {r['rps']:>7.1f} {r['p50_ms']:>8.1f}"
                  f" {r['p95_ms']:>8.1f} {r['p50_ms'] - direct['p50_ms']:>8.1f}")  # fmt: skip
        print("embedded cold starts (s): " + ", ".join(f"{s:.2f}" for s in outside["cold_answer_s"]))
    in_process = results.get("in_process")
    if in_process:
        print(f"in-process: {len(in_process['queries_first_in_a_second'])} SQL queries (the first request in a "
              f"second), {len(in_process['queries_cached'])} (the others); "
              f"{in_process['profiled_ms_per_request']:.1f} ms a request under cProfile")  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", default=str(ROOT / "bench" / "out" / "inference.json"))
    parser.add_argument("--seconds", type=float, default=15.0, help="each path's time at each concurrency")
    parser.add_argument("--rounds", type=int, default=3, help="the paths take turns this many times")
    parser.add_argument("--clients", default="1,4,8")
    parser.add_argument("--tokens", default="16,256", help="max_tokens of the throughput runs")
    parser.add_argument("--cold-runs", type=int, default=3)
    parser.add_argument("--warm-runs", type=int, default=30)
    parser.add_argument("--loop-period-s", type=float, default=2.0, help="PORTAL_SCHEDULER_INTERVAL_S's default")
    parser.add_argument("--scale-up-after-s", type=int, default=5, help="the profile's (the catalog's default)")
    parser.add_argument("-k", default="", help="only the cases matching (pytest's -k)")
    parser.add_argument("--embedded", action="store_true", help="also through the embedded portal (deploy/run.sh)")
    parser.add_argument("--only-embedded", action="store_true", help="only through the embedded portal")
    args = parser.parse_args()
    out = Path(args.json)
    if args.only_embedded:
        results = {"embedded": embedded(args)}
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(results, indent=2))
        report(results)
        return 0
    out.unlink(missing_ok=True)
    os.environ.update({
        "BENCH_INFERENCE_OUT": str(out), "BENCH_SECONDS": str(args.seconds), "BENCH_ROUNDS": str(args.rounds),
        "BENCH_CLIENTS": args.clients,
        "BENCH_TOKENS": args.tokens, "BENCH_COLD_RUNS": str(args.cold_runs), "BENCH_WARM_RUNS": str(args.warm_runs),
        "BENCH_LOOP_PERIOD_S": str(args.loop_period_s), "BENCH_SCALE_UP_AFTER_S": str(args.scale_up_after_s),
    })  # fmt: skip
    os.environ.setdefault("DATABASE_POOL_MAX", "10")
    os.chdir(ROOT)
    sys.path.insert(0, str(ROOT))
    import pytest

    options = ["bench/inference_cases.py", "-q", "-s", "-p", "no:cacheprovider", "-o", "log_level=WARNING"]
    status = pytest.main([*options, *(["-k", args.k] if args.k else [])])
    results = json.loads(out.read_text()) if out.exists() else {}
    if args.embedded:
        results["embedded"] = embedded(args)
        out.write_text(json.dumps(results, indent=2))
    report(results)
    print(f"\n{out}")
    return int(status)


if __name__ == "__main__":
    sys.exit(main())
