"""A real configurable-http-proxy in front of a test server, as deploy/run.sh puts one in front
of the portal: for tests that reach notebooks the way a browser does."""

from __future__ import annotations

import json
import secrets
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHP = ROOT / "node_modules" / ".bin" / "configurable-http-proxy"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Proxy:
    url: str  # the public side, where browsers go
    api_url: str
    token: str
    process: subprocess.Popen[bytes]

    def routes(self) -> dict[str, dict[str, object]]:
        request = urllib.request.Request(f"{self.api_url}/api/routes", headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(request, timeout=5) as response:
            return dict(json.loads(response.read()))


@contextmanager
def running_proxy(default_target: str, log: Path) -> Iterator[Proxy]:
    if not CHP.exists():
        raise RuntimeError(f"{CHP} is missing: run deploy/test.sh, which installs the pinned Node packages")
    port, api_port, token = free_port(), free_port(), secrets.token_hex(16)
    with open(log, "ab") as out:
        process = subprocess.Popen(
            [str(CHP), "--ip", "127.0.0.1", "--port", str(port), "--api-ip", "127.0.0.1", "--api-port", str(api_port),
             "--default-target", default_target, "--no-x-forward", "--log-level", "warn"],
            env={"PATH": "/usr/local/bin:/usr/bin:/bin", "CONFIGPROXY_AUTH_TOKEN": token},
            stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    proxy = Proxy(f"http://127.0.0.1:{port}", f"http://127.0.0.1:{api_port}", token, process)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                proxy.routes()
                break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"configurable-http-proxy did not start; see {log}") from None
                time.sleep(0.1)
        yield proxy
    finally:
        process.terminate()
        process.wait(timeout=10)
