"""Settings of the production web process: ``gunicorn -c python:portal.gunicorn_conf portal.asgi:application``.

Gunicorn runs several uvicorn workers, each serving HTTP and WebSockets (ASGI) from its own
process: Django runs a process's synchronous views one at a time, so one worker per core is what
uses the machine. Gunicorn restarts a worker that dies or hangs, and replaces workers one by one
on SIGHUP. Settings come from the environment (docs/operations.md).
"""

from __future__ import annotations

import os

from uvicorn_worker import UvicornWorker


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


class Worker(UvicornWorker):
    # Django's ASGI application has no lifespan events; say so instead of probing at each start.
    CONFIG_KWARGS = {**UvicornWorker.CONFIG_KWARGS, "lifespan": "off"}


bind = os.environ.get("PORTAL_WEB_BIND", "0.0.0.0:8000")
workers = int(os.environ.get("WEB_CONCURRENCY") or _cores())
worker_class = "portal.gunicorn_conf.Worker"
# A request that takes longer than this is a hung worker: it is killed and replaced.
timeout = int(os.environ.get("PORTAL_WEB_TIMEOUT_S", "60"))
graceful_timeout = 30
keepalive = 5
# Recycle workers now and then (spread out), which bounds what a slow leak can grow to.
max_requests = 20000
max_requests_jitter = 2000
accesslog = "-" if os.environ.get("PORTAL_WEB_ACCESS_LOG") else None
forwarded_allow_ips = os.environ.get("PORTAL_WEB_FORWARDED_ALLOW_IPS", "127.0.0.1")
