"""The cost of GPU telemetry: a sample of a 1,000-GPU cluster, and the storage a GPU costs a day.

    DATABASE_URL=postgres://... .venv/bin/python bench/telemetry.py [--gpus 1000] [--rounds 20]
    DATABASE_URL=postgres://... .venv/bin/python bench/telemetry.py --source nvml [--rounds 20]

With `--source nvml` (on a machine with NVIDIA GPUs and their driver) it times the local backend's
collector instead: NVML's readings of this machine's GPUs alone, and a whole sample (read, match,
store) of a local cluster holding them; it says so and stops where NVML cannot be read.

Makes a throwaway database (test_<name>) on the DATABASE_URL server with a Kubernetes cluster of
`--gpus` H100 (8 a node), a DCGM exporter on loopback serving their metrics in its text format,
and times `apps.telemetry.record.sample()` (the HTTP read, the parse, matching devices and their
holders, one bulk insert) over `--rounds` rounds. Then it measures the table's size per sample
row (PostgreSQL's own figure, indexes included) and works out a GPU's rows and bytes a day at
each resolution.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
os.environ["PORTAL_SCHEDULER_TRIGGER"] = "off"
os.environ["PORTAL_WORKLOAD_TRIGGER"] = "off"
os.environ.setdefault("LOG_LEVEL", "WARNING")

import django  # noqa: E402

django.setup()

from django.db import connection  # noqa: E402
from django.test.utils import setup_test_environment  # noqa: E402


def exporter_text(gpus: int) -> str:
    lines = []
    for field, value in (
        ("DCGM_FI_DEV_GPU_UTIL", "57"),
        ("DCGM_FI_DEV_FB_USED", "40960"),
        ("DCGM_FI_DEV_FB_FREE", "40960"),
        ("DCGM_FI_DEV_GPU_TEMP", "61"),
        ("DCGM_FI_DEV_POWER_USAGE", "412.5"),
    ):
        lines.append(f"# TYPE {field} gauge")
        for i in range(gpus):
            node, index = divmod(i, 8)
            labels = f'gpu="{index}",UUID="GPU-{i:08d}",device="nvidia{index}",Hostname="node-{node}"'
            lines.append(f"{field}{{{labels}}} {value}")
    return "\n".join(lines) + "\n"


def serve(text: str) -> tuple[ThreadingHTTPServer, str]:
    body = text.encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (the standard library's name)
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/metrics"


def nvml(rounds: int) -> dict[str, Any]:
    """This machine's GPUs through NVML: the readings alone, then whole samples of a local cluster."""
    from apps.inventory.models import GPU, Cluster, Node, NodePool
    from apps.telemetry.collectors import NvmlCollector
    from apps.telemetry.record import sample

    collector = NvmlCollector()
    first = collector.readings()  # NoTelemetry where there is no driver: the caller says so
    reads = []
    for _ in range(rounds):
        began = time.perf_counter()
        collector.readings()
        reads.append(time.perf_counter() - began)
    cluster = Cluster.objects.create(name="bench-local", kind=Cluster.Kind.LOCAL)
    node = Node.objects.create(pool=NodePool.objects.create(cluster=cluster, name="local"), name="local")
    for r in first:
        GPU.objects.create(node=node, index=r.index, uuid=r.uuid, gpu_type="gpu", memory_mb=r.memory_total_mb)
    sample()  # warm
    samples = []
    for _ in range(rounds):
        began = time.perf_counter()
        assert sample() == len(first)
        samples.append(time.perf_counter() - began)
    return {
        "source": "nvml",
        "gpus": len(first),
        "rounds": rounds,
        "readings_p50_s": round(statistics.median(reads), 5),
        "sample_p50_s": round(statistics.median(samples), 5),
        "sample_max_s": round(max(samples), 5),
        "per_gpu_ms": round(statistics.median(samples) / max(1, len(first)) * 1000, 3),
        "readings": [
            {
                "index": r.index,
                "utilisation": r.utilisation,
                "memory_used_mb": r.memory_used_mb,
                "memory_total_mb": r.memory_total_mb,
                "temperature_c": r.temperature_c,
                "power_w": r.power_w,
            }
            for r in first
        ],  # fmt: skip
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", choices=("dcgm", "nvml"), default="dcgm")
    parser.add_argument("--gpus", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if connection.vendor != "postgresql":
        print("Set DATABASE_URL to a PostgreSQL server (a throwaway database is made there).", file=sys.stderr)
        return 2
    setup_test_environment()
    if args.source == "nvml":
        from apps.telemetry.collectors import NoTelemetry

        name = connection.creation.create_test_db(verbosity=0, autoclobber=True)
        try:
            result = nvml(args.rounds)
        except NoTelemetry as exc:
            print(f"No NVML figures on this machine: {exc}", file=sys.stderr)
            return 1
        finally:
            connection.creation.destroy_test_db(name, verbosity=0)
        return report(result, args.json)
    name = connection.creation.create_test_db(verbosity=0, autoclobber=True)
    server, url = serve(exporter_text(args.gpus))
    try:
        from apps.inventory.models import GPU, Cluster, Node, NodePool
        from apps.telemetry.models import GpuSample
        from apps.telemetry.record import sample

        cluster = Cluster.objects.create(name="k8s", kind=Cluster.Kind.KUBERNETES, connection={"dcgm_url": url})
        pool = NodePool.objects.create(cluster=cluster, name="gpu")
        nodes = [Node.objects.create(pool=pool, name=f"node-{n}") for n in range((args.gpus + 7) // 8)]
        GPU.objects.bulk_create(
            GPU(node=nodes[i // 8], index=i % 8, uuid=f"GPU-{i:08d}", gpu_type="h100", model="H100", memory_mb=81920)
            for i in range(args.gpus)
        )
        sample()  # warm
        times = []
        for _ in range(args.rounds):
            began = time.perf_counter()
            stored = sample()
            times.append(time.perf_counter() - began)
            assert stored == args.gpus, stored
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE telemetry_gpusample")
            cursor.execute("SELECT pg_total_relation_size('telemetry_gpusample')")
            size = cursor.fetchone()[0]
        rows = GpuSample.objects.count()
        per_row = size / rows
        raw_day, minutes_day, hours_day = 86400 / 10, 1440, 24
        result = {
            "source": "dcgm",
            "gpus": args.gpus,
            "rounds": args.rounds,
            "sample_p50_s": round(statistics.median(times), 4),
            "sample_max_s": round(max(times), 4),
            "per_gpu_ms": round(statistics.median(times) / args.gpus * 1000, 3),
            "bytes_per_row": round(per_row),
            "rows_kept_per_gpu": int(raw_day + 30 * minutes_day + 365 * hours_day),
            "bytes_per_gpu_day_raw": round(per_row * raw_day),
            "bytes_kept_per_gpu": round(per_row * (raw_day + 30 * minutes_day + 365 * hours_day)),
        }
    finally:
        server.shutdown()
        connection.creation.destroy_test_db(name, verbosity=0)
    return report(result, args.json)


def report(result: dict[str, Any], path: Path | None) -> int:
    print(json.dumps(result, indent=2))
    if path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
