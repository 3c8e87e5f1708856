"""What a tenant's workload or settings make the portal do with its output and on its behalf.

- A job's artifacts: a workload decides what it leaves behind, so the portal counts it (files,
  apparent bytes) before reading any of it, records nothing past the limits and says so on the job,
  and never reads it inside a database transaction (other tenants' writes wait on none of it).
- An alert rule's webhook: an owner names where the portal sends signed POSTs from inside its
  network, so loopback and private addresses are refused however written, a name is resolved once
  per delivery and the POST goes where the check looked (no DNS rebinding), and a failure says
  nothing of what the target answered (no port scanner). Real listeners on loopback; the one
  resolver call (`socket.getaddrinfo`) is patched to play the rebinding name.
- An alert rule's mail: only to the addresses of the workspace's members, under a one-line name,
  quoted, in a plain-text mail (no header injection, no mail to anyone on a tenant's word).
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test import Client
from django.utils import timezone

from apps.alerts import delivery
from apps.alerts.evaluate import evaluate
from apps.alerts.models import Alert, AlertRule
from apps.audit.models import AuditEvent
from apps.jobs import artifacts
from apps.jobs.actions import check_submit_job
from apps.jobs.models import Job
from apps.scheduling.trigger import COLLECT_ARTIFACTS, run_here
from apps.workloads import host
from portal.celery import app as celery_app
from tests.api.endpoints import job as api_job
from tests.converge import settle
from tests.mail import body_of, smtp_server
from tests.personas import World
from workers.backends import files
from workers.backends.base import ArtifactLimits
from workers.backends.files import collect_artifacts

GIB = 1 << 30
SPARSE_HUGE = "for n in 1 2 3; do truncate -s 20G artifacts/huge-$n.bin; done; printf kept > artifacts/small.txt"


@pytest.fixture
def run(settings: Any, tmp_path: Path, django_capture_on_commit_callbacks: Any) -> Callable[..., Job]:
    """Submit a CPU job of team-a's and let the scheduler admit it and this process start it."""
    settings.PORTAL_WORKLOAD_TRIGGER = "inline"
    settings.PORTAL_WORK_DIR = tmp_path / "work"

    def submit(world: World, command: str) -> Job:
        with django_capture_on_commit_callbacks(execute=True):
            job = check_submit_job(world.team_a, name="job", command=command, acting_user=world.alice)
        job.refresh_from_db()
        assert job.state == Job.State.RUNNING, (job.state, job.failure_reason, job.wait_reason)
        return job

    return submit


def test_it_refuses_sparse_huge_artifacts_by_their_size_without_reading_them(world: World, run: Any) -> None:
    job = run(world, SPARSE_HUGE)
    started = time.monotonic()
    job = settle(job)
    assert time.monotonic() - started < 10  # 60 GiB claimed, none of it read
    note = "artifacts not collected: 3 files of 60 GiB exceed the limit of 10 GiB"
    assert job.state == Job.State.SUCCEEDED and job.artifacts_note == note
    assert list(job.artifacts.values_list("path", flat=True)) == ["artifacts/small.txt"]  # within the limits: kept
    shown = world.client(world.alice).get(f"/api/v1/jobs/{job.pk}/").json()
    assert shown["artifacts_note"] == note and [a["path"] for a in shown["artifacts"]] == ["artifacts/small.txt"]
    event = AuditEvent.objects.get(action="job.artifacts_left_out", target_id=str(job.pk))
    assert event.data == {"note": note}
    browser = Client()
    browser.force_login(world.alice)
    page = browser.get(f"/w/team-a/jobs/{job.pk}/")
    assert page.status_code == 200 and note in page.content.decode()


def test_the_limits_are_counted_before_any_file_is_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "artifacts").mkdir()
    for n in range(3):
        with open(tmp_path / "artifacts" / f"huge-{n}.bin", "wb") as huge:
            huge.truncate(20 * GIB)
    read: list[int] = []
    real_pread = os.pread
    monkeypatch.setattr(files.os, "pread", lambda fd, n, at: read.append(n) or real_pread(fd, n, at))
    started = time.monotonic()
    found = collect_artifacts(tmp_path, ["artifacts"], ArtifactLimits(max_files=10_000, max_bytes=10 * GIB))
    assert time.monotonic() - started < 2
    assert found.files == [] and read == []
    assert found.note() == "artifacts not collected: 3 files of 60 GiB exceed the limit of 10 GiB"


def test_a_sparse_file_within_the_limits_is_hashed_as_its_true_content(tmp_path: Path) -> None:
    (tmp_path / "artifacts").mkdir()
    path = tmp_path / "artifacts" / "sparse.bin"
    with open(path, "wb") as sparse:
        sparse.truncate(64 << 20)
        for at in (0, 5 << 20, (64 << 20) - 3):
            sparse.seek(at)
            sparse.write(b"data")
    whole = path.read_bytes()
    [artifact] = collect_artifacts(tmp_path, ["artifacts"], ArtifactLimits(max_bytes=1 * GIB)).files
    assert artifact == ("artifacts/sparse.bin", len(whole), hashlib.sha256(whole).hexdigest())


def test_files_past_the_count_limit_are_not_recorded_and_the_job_says_so(world: World, run: Any, settings: Any) -> None:
    settings.PORTAL_ARTIFACTS_MAX_FILES = 5
    job = settle(run(world, "for n in 1 2 3 4 5 6 7 8; do echo $n > artifacts/f$n.txt; done"))
    assert job.state == Job.State.SUCCEEDED
    assert job.artifacts.count() == 5
    assert job.artifacts_note == "artifacts not collected: 3 files exceed the limit of 5 files"


def test_while_a_jobs_artifacts_are_read_no_transaction_is_open_and_another_tenant_submits(
    tx_world: World, run: Any, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    world = tx_world
    job = run(world, "head -c 1000000 /dev/urandom > artifacts/weights.bin")
    seen: dict[str, Any] = {}
    real_hash = files.sha256_of_file

    def hash_while_another_tenant_submits(fd: int, size: int) -> tuple[int, str]:
        seen["in_transaction"] = connection.in_atomic_block or connection.connection.info.transaction_status != 0
        settings.PORTAL_WORKLOAD_TRIGGER = "off"  # charlie's job is admitted, not started
        seen["status"] = _submit_in_another_thread(world, timeout_s=20)
        return real_hash(fd, size)

    monkeypatch.setattr(files, "sha256_of_file", hash_while_another_tenant_submits)
    job = settle(job)
    assert seen == {"in_transaction": False, "status": 201}
    assert job.state == Job.State.SUCCEEDED and job.artifacts.get().size_bytes == 1_000_000


def _submit_in_another_thread(world: World, *, timeout_s: float) -> int | str:
    """Charlie submits a job to team-b through the API, from a thread (and connection) of its own."""
    answer: list[int] = []

    def submit() -> None:
        try:
            body = {"workspace": "team-b", "name": "other", "command": "true"}
            answer.append(world.client(world.charlie).post("/api/v1/jobs/", body, format="json").status_code)
        finally:
            connection.close()

    thread = threading.Thread(target=submit, daemon=True)
    thread.start()
    thread.join(timeout_s)
    return answer[0] if answer else f"no answer in {timeout_s} s"


def test_with_workers_a_task_records_the_artifacts_and_then_the_end(
    world: World, run: Any, settings: Any, django_capture_on_commit_callbacks: Any
) -> None:
    job = run(world, "printf done > artifacts/out.txt")
    settings.PORTAL_WORKLOAD_TRIGGER = "task"
    deadline = time.monotonic() + 20
    with django_capture_on_commit_callbacks() as asked:  # the task is sent on commit: held here
        while Job.objects.get(pk=job.pk).artifacts_pending_since is None:
            assert time.monotonic() < deadline
            host.converge("job", job.pk)
            time.sleep(0.1)
    job.refresh_from_db()
    # The watch recorded the exit only: the end waits for the artifacts, read by a worker.
    assert job.state == Job.State.RUNNING and job.exit_code == 0 and not job.artifacts.exists()
    assert len(asked) == 1
    route = celery_app.amqp.router.route({}, COLLECT_ARTIFACTS, (job.pk,), {})
    assert route["queue"].name == settings.PROVISION_QUEUE  # a worker of its own, never the scheduler's
    run_here(COLLECT_ARTIFACTS, job.pk)
    job.refresh_from_db()
    assert job.state == Job.State.SUCCEEDED and job.artifacts_pending_since is None
    assert job.artifacts.get().sha256 == hashlib.sha256(b"done").hexdigest()
    run_here(COLLECT_ARTIFACTS, job.pk)  # twice: nothing more
    assert job.artifacts.count() == 1 and AuditEvent.objects.filter(action="job.succeeded").count() == 1


def test_a_lost_collection_is_asked_for_again(world: World, run: Any, settings: Any) -> None:
    job = settle(run(world, "printf done > artifacts/out.txt"))
    job.artifacts.all().delete()
    lost_at = job.finished_at - timedelta(seconds=artifacts.LOST_AFTER_S + 1)
    Job.objects.filter(pk=job.pk).update(artifacts_pending_since=lost_at)
    assert host.reconcile(sweep=False)["artifacts_resumed"] == 1
    job.refresh_from_db()
    assert job.artifacts_pending_since is None and job.artifacts.count() == 1


def test_a_cancelled_jobs_artifacts_are_recorded_once_it_stopped(
    world: World, run: Any, django_capture_on_commit_callbacks: Any
) -> None:
    from apps.jobs.actions import do_cancel_job

    job = run(world, "printf partial > artifacts/checkpoint.txt; exec sleep 100")
    deadline = time.monotonic() + 10
    while not Path(job.backend_state["job_dir"], "artifacts", "checkpoint.txt").exists():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    with django_capture_on_commit_callbacks(execute=True):
        do_cancel_job(job, acting_user=world.alice)
    job.refresh_from_db()
    assert job.state == Job.State.CANCELLED and job.artifacts_pending_since is None
    assert list(job.artifacts.values_list("path", flat=True)) == ["artifacts/checkpoint.txt"]


# -- alert webhooks --------------------------------------------------------------------------------

SECRET = "a-shared-secret-of-some-length"
NAME = "hooks.example.test"
PUBLIC = "192.0.0.9"  # a global address (the check passes it); nothing here listens for the portal


@dataclass
class Listener:
    """A real HTTP(S) server on loopback that keeps each POST and answers `status` with `body`."""

    port: int = 0
    received: list[tuple[Any, bytes]] = field(default_factory=list)
    status: int = 200
    body: bytes = b""
    hang: bool = False


@contextmanager
def listening(tls: ssl.SSLContext | None = None) -> Iterator[Listener]:
    got = Listener()
    stop = threading.Event()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            got.received.append((self.headers, self.rfile.read(int(self.headers["Content-Length"]))))
            if got.hang:
                stop.wait(10)
            self.send_response(got.status)
            self.send_header("Content-Length", str(len(got.body)))
            self.end_headers()
            self.wfile.write(got.body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    got.port = server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield got
    finally:
        stop.set()
        server.shutdown()
        server.server_close()


@dataclass
class Resolver:
    """`socket.getaddrinfo` for NAME answering each call with the next of `answers` (the last one
    from then on); any other host goes to the system's resolver."""

    answers: list[list[str]]
    calls: int = 0

    def __call__(self, host: Any, port: Any, *args: Any, **kwargs: Any) -> list[Any]:
        if host != NAME:
            return REAL_GETADDRINFO(host, port, *args, **kwargs)
        answer = self.answers[min(self.calls, len(self.answers) - 1)]
        self.calls += 1
        return [(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (a, int(port or 0))) for a in answer]


REAL_GETADDRINFO = socket.getaddrinfo


@pytest.fixture(autouse=False)
def alert_settings(settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    settings.PORTAL_ALERTS_REPEAT_S = 0
    settings.PORTAL_ALERTS_ALLOW_PRIVATE_WEBHOOKS = False
    monkeypatch.setattr(delivery, "WEBHOOK_TIMEOUT_S", 1.0)


def resolving(monkeypatch: pytest.MonkeyPatch, *answers: list[str]) -> Resolver:
    resolver = Resolver(list(answers))
    monkeypatch.setattr(socket, "getaddrinfo", resolver)
    return resolver


def fire(world: World, url: str) -> Alert:
    """A team-a rule whose webhook is `url`, saved as it stands (the delivery's checks alone), and
    one alert of it delivered."""
    rule = AlertRule.objects.create(name="queue", kind="queue_wait", workspace=world.team_a, threshold=Decimal("1"),
                                    webhook_url=url, webhook_secret=SECRET)  # fmt: skip
    made = api_job(world, world.team_a)
    Job.objects.filter(pk=made.pk).update(state=Job.State.QUEUED, created_at=timezone.now() - timedelta(seconds=100))
    evaluate(rules=[rule])
    return Alert.objects.get(rule=rule)


def test_a_name_that_turns_to_loopback_after_the_check_reaches_no_loopback_listener(
    world: World, alert_settings: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    with listening() as loopback:
        resolver = resolving(monkeypatch, [PUBLIC], ["127.0.0.1"])  # public when checked, loopback after
        alert = fire(world, f"http://{NAME}:{loopback.port}/hook")
    assert loopback.received == []  # the signed POST never reached loopback
    assert resolver.calls == 1  # resolved once: the address checked is the address connected to
    attempt = alert.last_delivery["webhook"]
    assert attempt["ok"] or attempt["error"] in ("delivery failed: timed out", "delivery failed: connection failed")


def test_every_address_a_name_resolves_to_is_checked(
    world: World, alert_settings: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    with listening() as loopback:
        resolving(monkeypatch, [PUBLIC, "127.0.0.1"])
        alert = fire(world, f"http://{NAME}:{loopback.port}/hook")
    assert loopback.received == []
    assert alert.last_delivery["webhook"]["error"] == "delivery failed: refused address"


@pytest.mark.parametrize(
    "host",
    ["127.1", "2130706433", "0x7f000001", "0177.0.0.1", "[::1]", "[::ffff:127.0.0.1]", "[::ffff:7f00:1]", "0",
     "localhost", "LOCALHOST.", "api.localhost", "[::]", "169.254.169.254", "10.0.0.8", "100.64.0.1", "224.0.0.1",
     "[fe80::1]", "[2002:7f00:1::]", "[64:ff9b::a00:1]", NAME],
)  # fmt: skip
def test_an_owners_webhook_to_loopback_or_private_addresses_is_refused_however_written(
    world: World, alert_settings: None, monkeypatch: pytest.MonkeyPatch, host: str
) -> None:
    resolving(monkeypatch, ["127.0.0.1"])  # NAME resolves to loopback
    body = {"workspace": "team-a", "name": "q", "kind": "queue_wait", "threshold": "60.00",
            "webhook_url": f"http://{host}:8000/hook", "webhook_secret": SECRET}  # fmt: skip
    answer = world.client(world.alice).post("/api/v1/alert-rules/", body, format="json")
    assert answer.status_code == 400, (host, answer.json())
    assert list(answer.json()["error"]["fields"]) == ["webhook_url"]
    assert not AlertRule.objects.exists()
    # Were one in the database all the same (saved before these checks), delivery refuses it.
    with listening() as loopback:
        alert = fire(world, f"http://{host}:{loopback.port}/hook")
    assert loopback.received == [] and alert.last_delivery["webhook"]["error"] == "delivery failed: refused address"


def test_a_delivery_failure_says_nothing_of_what_the_target_answered(
    world: World, alert_settings: None, settings: Any
) -> None:
    settings.PORTAL_ALERTS_ALLOW_PRIVATE_WEBHOOKS = True  # the targets are on loopback
    client = world.client(world.alice)
    with listening() as target:
        target.status, target.body = 500, b"internal: db-password=hunter2"
        alert = fire(world, f"http://127.0.0.1:{target.port}/hook")
        assert len(target.received) == 1
        assert alert.last_delivery["webhook"]["error"] == "delivery failed: HTTP error"
        shown = client.get(f"/api/v1/alerts/{alert.pk}/").json()
        assert "500" not in json.dumps(shown) and "hunter2" not in json.dumps(shown)
        port = target.port
    AlertRule.objects.all().delete()
    closed = fire(world, f"http://127.0.0.1:{port}/hook")  # nothing listens there now
    assert closed.last_delivery["webhook"]["error"] == "delivery failed: connection failed"
    AlertRule.objects.all().delete()
    with listening() as silent:
        silent.hang = True
        hung = fire(world, f"http://127.0.0.1:{silent.port}/hook")
    assert hung.last_delivery["webhook"]["error"] == "delivery failed: timed out"


def test_https_goes_to_the_checked_address_with_the_names_host_and_certificate(
    world: World, alert_settings: None, settings: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    settings.PORTAL_ALERTS_ALLOW_PRIVATE_WEBHOOKS = True  # the target is on loopback
    ca_file, good, wrong = certificates(tmp_path)
    monkeypatch.setenv("SSL_CERT_FILE", str(ca_file))  # the portal trusts the test's authority
    resolving(monkeypatch, ["127.0.0.1"])
    with listening(tls=good) as target:
        alert = fire(world, f"https://{NAME}:{target.port}/hook")
    assert alert.last_delivery["webhook"] == {**alert.last_delivery["webhook"], "ok": True, "error": ""}
    [(headers, body)] = target.received
    assert headers["Host"] == f"{NAME}:{target.port}" and json.loads(body)["rule"]["name"] == "queue"
    AlertRule.objects.all().delete()
    with listening(tls=wrong) as impostor:  # a certificate for another name
        alert = fire(world, f"https://{NAME}:{impostor.port}/hook")
    assert impostor.received == []
    assert alert.last_delivery["webhook"]["error"] == "delivery failed: connection failed"


def certificates(folder: Path) -> tuple[Path, ssl.SSLContext, ssl.SSLContext]:
    """A certificate authority's file, and server contexts with its certificates for NAME and for
    another name."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    def issue(subject: str, key: Any, issuer_name: Any, issuer_key: Any, *, ca: bool) -> Any:
        now = timezone.now()
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
            .issuer_name(issuer_name or x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - timedelta(minutes=5))
            .not_valid_after(now + timedelta(hours=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if ca:
            builder = builder.add_extension(
                x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                              key_encipherment=False, data_encipherment=False, key_agreement=False,
                              encipher_only=False, decipher_only=False), critical=True)  # fmt: skip
            builder = builder.add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
        else:
            builder = builder.add_extension(x509.SubjectAlternativeName([x509.DNSName(subject)]), critical=False)
        return builder.sign(issuer_key, hashes.SHA256())

    pem = serialization.Encoding.PEM
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = issue("test authority", ca_key, None, ca_key, ca=True)
    ca_file = folder / "ca.pem"
    ca_file.write_bytes(ca_cert.public_bytes(pem))
    contexts = []
    for name in (NAME, "elsewhere.example.test"):
        key = ec.generate_private_key(ec.SECP256R1())
        cert = issue(name, key, ca_cert.subject, ca_key, ca=False)
        chain = folder / f"{name}.pem"
        private = key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
        chain.write_bytes(cert.public_bytes(pem) + private)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(chain)
        contexts.append(context)
    return ca_file, contexts[0], contexts[1]


# -- alert mail ------------------------------------------------------------------------------------


def rule_body(**fields: Any) -> dict[str, Any]:
    return {"workspace": "team-a", "name": "queue", "kind": "queue_wait", "threshold": "60.00", **fields}


def test_an_owner_may_mail_only_the_workspaces_members(world: World, alert_settings: None) -> None:
    alice = world.client(world.alice)
    charlie_elsewhere = world.charlie.email  # a member of team-b, not of team-a
    get_user_model().objects.create_user("gone", "gone@example.org", is_active=False)
    for outsider in ("victim@example.net", charlie_elsewhere, "gone@example.org"):
        answer = alice.post("/api/v1/alert-rules/", rule_body(emails=["bob@example.org", outsider]), format="json")
        assert answer.status_code == 400, outsider
        assert list(answer.json()["error"]["fields"]) == ["emails"] and outsider in str(answer.json())
    assert not AlertRule.objects.exists()
    # Members of any role: through the team's group (bob), a membership (victor, a viewer), the owner.
    members = ["bob@example.org", "Victor@Example.org", "alice@example.org"]
    made = alice.post("/api/v1/alert-rules/", rule_body(emails=members), format="json")
    assert made.status_code == 201, made.json()
    rule = made.json()["id"]
    adding = alice.patch(f"/api/v1/alert-rules/{rule}/", {"emails": [*members, "victim@example.net"]}, format="json")
    assert adding.status_code == 400 and list(adding.json()["error"]["fields"]) == ["emails"]
    # A platform admin's addresses (trusted) stay when an owner changes something else.
    admin = world.client(world.admin)
    assert (
        admin.patch(f"/api/v1/alert-rules/{rule}/", {"emails": ["ops@example.net"]}, format="json").status_code == 200
    )
    assert alice.patch(f"/api/v1/alert-rules/{rule}/", {"threshold": "90.00"}, format="json").status_code == 200


@pytest.mark.parametrize(
    "name",
    ["queue\r\nBcc: victim@example.net", "queue\nsecond line", "queue\u2028next", "tab\there", "x" * 101, "  "],
)
def test_a_rule_name_is_one_short_line(world: World, alert_settings: None, name: str) -> None:
    answer = world.client(world.alice).post("/api/v1/alert-rules/", rule_body(name=name), format="json")
    assert answer.status_code == 400 and list(answer.json()["error"]["fields"]) == ["name"], answer.json()
    assert not AlertRule.objects.exists()


def test_alert_mail_is_plain_with_the_rules_name_quoted_on_one_line(
    world: World, alert_settings: None, settings: Any
) -> None:
    with smtp_server() as mailbox:
        for name, value in mailbox.settings().items():
            setattr(settings, name, value)
        # A name saved before names were checked: its line breaks do not reach the mail's headers.
        rule = AlertRule.objects.create(
            name="queue\r\nBcc: victim@example.net", kind="queue_wait", workspace=world.team_a,
            threshold=Decimal("1"), emails=["bob@example.org"],
        )  # fmt: skip
        made = api_job(world, world.team_a)
        Job.objects.filter(pk=made.pk).update(state=Job.State.QUEUED, created_at=timezone.now() - timedelta(seconds=99))
        evaluate(rules=[rule])
        [mail] = mailbox.wait_for(1)
    assert mail["Subject"] == '[FIRING] Alert rule "queue  Bcc: victim@example.net": workspace=team-a'
    assert mail["X-Envelope-To"] == "bob@example.org" and mail["Bcc"] is None
    assert mail.get_content_type() == "text/plain" and not mail.is_multipart()
    assert body_of(mail).splitlines()[0] == 'Firing: alert rule "queue  Bcc: victim@example.net"'
