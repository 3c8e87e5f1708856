"""Inference endpoints for real on the local backend: llama.cpp's server (its environment built by
deploy/test.sh) serving a tiny model made here, each replica in its sandbox on its own Unix socket,
admitted by the scheduler and started by the workload host, called through the notebook proxy in
front of the live portal with endpoint tokens, as any OpenAI client calls it."""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import httpx
import pytest
from prometheus_client import generate_latest

from apps.accounts.api_tokens import do_create_token, do_revoke_token
from apps.accounts.models import ApiToken
from apps.inference.actions import do_update_endpoint
from apps.inference.models import Endpoint, Replica, ScaleEvent
from apps.monitoring.metrics import registry
from tests.inference.endpoints import cpu_profile, endpoint, model_in
from tests.inference.serving import chat, client, serving, turn_until
from tests.leftovers import stop_everything_of
from tests.personas import World, api_token
from tests.proxy import Proxy

pytestmark = pytest.mark.slow


@pytest.fixture
def work(proxy: Proxy, settings: Any, tmp_path: Path) -> Iterator[Path]:
    """A work directory the workspaces' accounts can reach (pytest's own are private to root)."""
    work = Path(f"/tmp/gpi-{os.getpid()}-{tmp_path.name[-12:]}")
    work.mkdir(mode=0o711)
    settings.PORTAL_WORK_DIR = work
    settings.PORTAL_INFERENCE_START_TIMEOUT_S = 60
    try:
        yield work
    finally:
        stop_everything_of(str(work))


def endpoint_token(user: Any, made: Endpoint) -> str:
    return do_create_token(user, name="app", expires_in_days=1, endpoint=made, acting_user=user)[1]


def test_an_endpoint_serves_the_openai_api_to_its_tokens_alone(tx_world: World, proxy: Proxy, work: Path) -> None:
    world = tx_world
    made = endpoint(world.team_a, world.alice, cpu_profile())
    replica = turn_until(lambda: serving(made))[0]
    assert replica.proxy_target.startswith("http+unix://")
    # The server itself takes no request without the replica's own key, which only the proxy sends.
    socket_path = unquote(urlsplit(replica.proxy_target).netloc)
    with httpx.Client(transport=httpx.HTTPTransport(uds=socket_path), base_url="http://replica") as direct:
        assert direct.get("/v1/models").status_code == 401
        keyed = direct.get("/v1/models", headers={"Authorization": f"Bearer {replica.api_key}"})
        assert keyed.status_code == 200
    token = endpoint_token(world.alice, made)
    with client(made, token, proxy.url) as http:
        answer = chat(http, made)
        assert answer.status_code == 200, answer.text
        assert answer.json()["choices"][0]["message"]["role"] == "assistant"
        assert answer.json()["usage"]["completion_tokens"] > 0
        completion = http.post("/completions", json={"model": made.name, "prompt": "Once", "max_tokens": 4})
        assert completion.status_code == 200 and completion.json()["choices"][0]["text"] is not None
        with http.stream("POST", "/chat/completions", json={
            "model": made.name, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "stream": True,
        }) as streamed:  # fmt: skip
            lines = [line for line in streamed.iter_lines() if line.startswith("data: ")]
        assert streamed.status_code == 200 and lines[-1] == "data: [DONE]" and len(lines) >= 2
        assert http.get("/models").json()["data"][0]["id"] == made.name

        # Bad input gets a clear answer and reaches no server.
        not_json = http.post("/chat/completions", content=b"{not json", headers={"Content-Type": "application/json"})
        assert not_json.status_code == 400 and "not JSON" in not_json.json()["error"]["message"]
        huge = http.post("/completions", json={"model": made.name, "prompt": "x" * (5 * 2**20)})
        assert huge.status_code == 413 and "KiB at most" in huge.json()["error"]["message"]
        for path in ("/v1/../metrics", "/v1/%2e%2e/metrics", "/metrics", "/docs"):
            outside = http.get(f"http://127.0.0.1:{http.base_url.port}{path}")
            assert outside.status_code == 404 and "under /v1/" in outside.json()["error"]["message"], path

    # Who may call it: a member's portal token, not a viewer's, not another tenant's, nobody unsigned.
    member = api_token(world.bob)
    with client(made, member, proxy.url) as http:
        assert chat(http, made).status_code == 200
    with client(made, api_token(world.victor), proxy.url) as http:
        assert chat(http, made).status_code == 403
    stranger = api_token(world.charlie)
    with client(made, stranger, proxy.url) as http:
        refused = chat(http, made)
        assert refused.status_code == 404 and refused.json()["error"]["message"] == "No such endpoint."
    with client(made, "", proxy.url) as http:
        assert chat(http, made, headers={"Authorization": ""}).status_code == 401
    # A token made for another endpoint opens nothing here, even in the same workspace.
    other = endpoint(world.team_a, world.alice, cpu_profile("other-cpu"), name="other")
    with client(made, endpoint_token(world.alice, other), proxy.url) as http:
        assert chat(http, made).status_code == 404
    # A revoked token is refused at once, saying so.
    do_revoke_token(ApiToken.objects.get(endpoint=made), reason="leaked", acting_user=world.alice)
    with client(made, token, proxy.url) as http:
        revoked = chat(http, made)
        assert revoked.status_code == 401 and "revoked" in revoked.json()["error"]["message"]


def _load(
    made: Endpoint, token: str, proxy: Proxy, stop: threading.Event, results: list[int], workers: int
) -> list[threading.Thread]:
    def run() -> None:
        with client(made, token, proxy.url) as http:
            while not stop.is_set():
                try:
                    results.append(chat(http, made, max_tokens=48).status_code)
                except httpx.HTTPError:
                    results.append(-1)

    threads = [threading.Thread(target=run, daemon=True) for _ in range(workers)]
    for thread in threads:
        thread.start()
    return threads


def test_load_scales_an_endpoint_up_and_quiet_scales_it_back_down(tx_world: World, proxy: Proxy, work: Path) -> None:
    world = tx_world
    profile = cpu_profile(concurrency=1, scale_up_after_s=1, scale_down_after_s=2)
    made = endpoint(world.team_a, world.alice, profile, min_replicas=1, max_replicas=2)
    turn_until(lambda: serving(made))
    token = endpoint_token(world.alice, made)
    stop, results = threading.Event(), []
    threads = _load(made, token, proxy, stop, results, workers=4)
    try:
        turn_until(lambda: len(serving(made)) == 2, timeout_s=60)
        up = ScaleEvent.objects.filter(endpoint=made, to_replicas=2).first()
        assert up is not None and "in flight or waiting" in up.reason
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=60)
    assert results and set(results) == {200}, sorted(set(results))
    turn_until(lambda: len(serving(made)) == 1, timeout_s=60)
    down = ScaleEvent.objects.filter(endpoint=made, from_replicas=2, to_replicas=1).first()
    assert down is not None and "served the load" in down.reason
    assert Endpoint.objects.get(pk=made.pk).samples.exists()
    # The same figures in /metrics: what the proxy counted, the replicas against the bounds.
    text = generate_latest(registry()).decode()
    served = f'gpuportal_endpoint_requests_total{{endpoint="chat",workspace="team-a"}} {float(len(results))}'
    assert served in text, [line for line in text.splitlines() if "gpuportal_endpoint_requests_total" in line]
    assert 'gpuportal_endpoint_replicas{endpoint="chat",kind="max",workspace="team-a"} 2.0' in text
    assert 'gpuportal_endpoint_request_seconds_count{endpoint="chat",workspace="team-a"}' in text
    tokens = r'gpuportal_endpoint_completion_tokens_total\{endpoint="chat",workspace="team-a"\} (\S+)'
    generated = re.search(tokens, text)
    assert generated is not None and float(generated.group(1)) > 0  # the answers' own usage


def test_an_endpoint_scaled_to_zero_starts_a_replica_for_the_next_request(
    tx_world: World, proxy: Proxy, work: Path
) -> None:
    world = tx_world
    made = endpoint(world.team_a, world.alice, cpu_profile(), min_replicas=1, max_replicas=1, scale_to_zero_s=60)
    turn_until(lambda: serving(made))
    Endpoint.objects.filter(pk=made.pk).update(last_request_at=made.created_at.replace(year=2020))
    turn_until(lambda: Endpoint.objects.get(pk=made.pk).state == Endpoint.State.IDLE and not serving(made))
    token = endpoint_token(world.alice, made)
    answers: list[httpx.Response] = []

    def call() -> None:
        with client(made, token, proxy.url) as http:
            answers.append(chat(http, made, headers={"Prefer": "wait=60"}))

    started = time.monotonic()
    caller = threading.Thread(target=call)
    caller.start()
    turn_until(lambda: answers, timeout_s=90)
    caller.join()
    assert answers[0].status_code == 200, answers[0].text
    assert time.monotonic() - started < 60
    assert "no replica runs" in ScaleEvent.objects.filter(endpoint=made).first().reason

    # With no patience left, a cold endpoint says so at once, with when to come back.
    Endpoint.objects.filter(pk=made.pk).update(last_request_at=made.created_at.replace(year=2020))
    turn_until(lambda: not serving(made))
    with client(made, token, proxy.url) as http:
        busy = chat(http, made, headers={"Prefer": "wait=0"})
    assert busy.status_code == 503 and busy.headers["Retry-After"] == "10"
    assert "no replica serves yet" in busy.json()["error"]["message"]


def test_a_new_version_rolls_out_with_no_failed_request(tx_world: World, proxy: Proxy, work: Path) -> None:
    world = tx_world
    made = endpoint(world.team_a, world.alice, cpu_profile(concurrency=4), min_replicas=1, max_replicas=1)
    old = turn_until(lambda: serving(made))[0]
    token = endpoint_token(world.alice, made)
    stop, results = threading.Event(), []
    threads = _load(made, token, proxy, stop, results, workers=2)
    try:
        do_update_endpoint(made, model={"path": model_in(world.team_a, "models/v2.gguf")}, acting_user=world.alice)
        turn_until(lambda: Replica.objects.get(pk=old.pk).state == Replica.State.STOPPED, timeout_s=90)
        new = serving(made)
        assert len(new) == 1 and new[0].version == 2
        time.sleep(1)  # requests keep coming to the new one
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=60)
    assert len(results) > 5 and set(results) == {200}, sorted(set(results))
    assert Replica.objects.get(pk=old.pk).reason == "replaced by version 2"
    assert Endpoint.objects.get(pk=made.pk).model_path == "models/v2.gguf"


def test_a_replica_killed_under_load_is_replaced_and_no_request_hangs(
    tx_world: World, proxy: Proxy, work: Path
) -> None:
    world = tx_world
    made = endpoint(world.team_a, world.alice, cpu_profile(concurrency=2), min_replicas=2, max_replicas=2)
    turn_until(lambda: len(serving(made)) == 2)
    token = endpoint_token(world.alice, made)
    stop, results = threading.Event(), []
    threads = _load(made, token, proxy, stop, results, workers=3)
    try:
        time.sleep(1)
        victim = serving(made)[0]
        for pid in victim.backend_state["replicas"][0].get("pids", [victim.backend_state["replicas"][0]["pid"]]):
            os.killpg(pid, signal.SIGKILL)
        turn_until(lambda: Replica.objects.get(pk=victim.pk).state == Replica.State.FAILED, timeout_s=60)
        turn_until(lambda: len(serving(made)) == 2, timeout_s=90)
        served_before = len(results)
        time.sleep(1)
        assert len(results) > served_before  # it keeps serving
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=60)
            assert not thread.is_alive()  # no request hangs
    assert results.count(200) > 5
    assert set(results) <= {200, 502}, sorted(set(results))
    assert Endpoint.objects.get(pk=made.pk).state == Endpoint.State.READY


def test_a_server_that_cannot_start_fails_the_endpoint_with_its_last_words(
    tx_world: World, proxy: Proxy, work: Path
) -> None:
    world = tx_world
    model = work / "team-a" / "models" / "broken.gguf"
    model.parent.mkdir(parents=True, exist_ok=True)
    model.write_bytes(b"GGUF" + (3).to_bytes(4, "little") + os.urandom(256))  # a GGUF header, garbage after
    made = endpoint(world.team_a, world.alice, cpu_profile(), path="models/broken.gguf")
    failed = turn_until(lambda: Endpoint.objects.filter(pk=made.pk, state=Endpoint.State.FAILED).first())
    assert "did not start" in failed.failure_reason and "the server exited before it answered" in failed.failure_reason
    assert not Replica.objects.filter(endpoint=made).exclude(state__in=Replica.FINAL_STATES).exists()
