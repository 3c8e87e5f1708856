"""The llama.cpp server of an inference endpoint, for real: started from its built environment with
``servers.command`` on a Unix socket, serving a tiny GGUF model made here, and spoken to in the
OpenAI API as a client would (completions, chat completions, streamed chat completions).

The environment is built by deploy/test.sh (``ensure_inference_env`` in deploy/services.sh), never
by the tests: compiling llama.cpp takes minutes.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.inference.tinymodel import write_tiny_gguf
from workers.backends import servers
from workers.backends.pyenv import ensure_serve_env, serve_env_is_built

pytestmark = pytest.mark.slow

# Where the local backend of the tests finds its environments (tests/conftest.py).
ENV_ROOT = Path(os.environ.get("PORTAL_TEST_ENV_DIR", Path.home() / ".cache" / "gpuportal" / "test-envs"))
SERVED_NAME = "tiny-chat"
START_TIMEOUT_S = 60.0


@dataclass
class Server:
    process: subprocess.Popen[str]
    socket: Path
    log: Path

    def client(self) -> httpx.Client:
        return httpx.Client(transport=httpx.HTTPTransport(uds=str(self.socket)), base_url="http://replica", timeout=30)


@pytest.fixture(scope="module")
def serve_env() -> Path:
    if not serve_env_is_built("llamacpp", ENV_ROOT):
        pytest.fail(
            f"the llama.cpp server's environment is not built under {ENV_ROOT}: deploy/test.sh builds it "
            "(ensure_inference_env in deploy/services.sh; run: source deploy/lib.sh; source deploy/services.sh; "
            "ensure_inference_env)"
        )
    return ensure_serve_env("llamacpp", ENV_ROOT)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("model") / "tiny.gguf")


def start(env_dir: Path, model: Path, work: Path) -> Server:
    """The server as a replica runs it: its command and environment, nothing of this process's."""
    argv, env = servers.command(
        "llamacpp", model_path=str(model), socket_path=str(work / "s.sock"), served_name=SERVED_NAME, cpu_cores=1
    )
    env |= {"PATH": f"{env_dir / 'bin'}:/usr/bin:/bin", "HOME": str(work)}
    log = work / "server.log"
    with open(log, "w") as out:
        process = subprocess.Popen(argv, env=env, cwd=work, stdout=out, stderr=subprocess.STDOUT, text=True)
    return Server(process, work / "s.sock", log)


def stop(server: Server) -> None:
    server.process.terminate()
    try:
        server.process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        server.process.kill()
        server.process.wait()


def wait_healthy(server: Server) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            pytest.fail(f"the server exited ({server.process.returncode}):\n{last_lines(server.log)}")
        if server.socket.exists():
            try:
                with server.client() as client:
                    if client.get(servers.LLAMACPP.health_path).status_code == 200:
                        return
            except httpx.TransportError:
                pass
        time.sleep(0.05)
    pytest.fail(f"the server did not answer in {START_TIMEOUT_S:.0f}s:\n{last_lines(server.log)}")


def post(server: Server, path: str, body: dict[str, object]) -> httpx.Response:
    with server.client() as client:
        return client.post(path, json=body)


def last_lines(log: Path, count: int = 15) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-count:])


@pytest.fixture(scope="module")
def server(serve_env: Path, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    running = start(serve_env, tiny_model, tmp_path_factory.mktemp("replica"))
    try:
        wait_healthy(running)
        yield running
    finally:
        stop(running)


def test_it_answers_its_health_path_with_the_served_name(server: Server) -> None:
    with server.client() as client:
        response = client.get(servers.LLAMACPP.health_path)
    assert response.status_code == 200
    assert [model["id"] for model in response.json()["data"]] == [SERVED_NAME]


def test_it_listens_on_its_socket_and_no_tcp_port(server: Server) -> None:
    own = {os.readlink(f"/proc/{server.process.pid}/fd/{fd}") for fd in os.listdir(f"/proc/{server.process.pid}/fd")}
    inodes = {link[len("socket:[") : -1] for link in own if link.startswith("socket:[")}
    listening = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for row in Path(table).read_text().splitlines()[1:]:
            fields = row.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                listening.append(fields[1])
    assert listening == []
    assert server.socket.is_socket()


def test_it_completes_a_prompt(server: Server) -> None:
    body = {"model": SERVED_NAME, "prompt": "Hello, world", "max_tokens": 8, "temperature": 0, "seed": 1}
    with server.client() as client:
        response = client.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["object"] == "text_completion" and answer["model"] == SERVED_NAME
    assert isinstance(answer["choices"][0]["text"], str) and answer["choices"][0]["finish_reason"] in ("length", "stop")
    # At least one token; maybe a few past max_tokens: llama-cpp-python completes a character whose
    # UTF-8 bytes the byte-level tokens left unfinished.
    assert answer["usage"]["prompt_tokens"] > 1 and answer["usage"]["completion_tokens"] >= 1


def test_it_answers_a_chat(server: Server) -> None:
    body = {
        "model": SERVED_NAME,
        "messages": [{"role": "user", "content": "Hi there"}],
        "max_tokens": 8,
        "temperature": 0,
    }
    with server.client() as client:
        response = client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["object"] == "chat.completion" and answer["model"] == SERVED_NAME
    assert answer["choices"][0]["message"]["role"] == "assistant"
    assert isinstance(answer["choices"][0]["message"]["content"], str)
    assert answer["usage"]["total_tokens"] == answer["usage"]["prompt_tokens"] + answer["usage"]["completion_tokens"]
    assert answer["usage"]["completion_tokens"] >= 1


def test_it_streams_a_chat_as_server_sent_events(server: Server) -> None:
    body = {
        "model": SERVED_NAME,
        "messages": [{"role": "user", "content": "Tell me a story"}],
        "max_tokens": 6,
        "temperature": 0,
        "stream": True,
    }
    with server.client() as client, client.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [line[len("data: ") :] for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    assert len(chunks) >= 2 and all(chunk["object"] == "chat.completion.chunk" for chunk in chunks)
    assert chunks[0]["choices"][0]["delta"].get("role") == "assistant"
    assert chunks[-1]["choices"][0]["finish_reason"] in ("length", "stop")


def test_a_file_that_is_no_model_is_refused_and_the_server_exits_on_it(serve_env: Path, tmp_path: Path) -> None:
    text = tmp_path / "notes.gguf"
    text.write_text("these are notes, not weights\n")
    assert "is not a GGUF file" in (servers.check_model("llamacpp", text) or "")

    server = start(serve_env, text, tmp_path)  # started anyway: it must exit, saying why
    try:
        server.process.wait(timeout=START_TIMEOUT_S)
    finally:
        stop(server)
    assert server.process.returncode != 0
    assert not server.socket.exists()
    log = last_lines(server.log)
    assert "Failed to load model" in log or "failed to load model" in log, log


def test_a_stream_is_not_cut_short_by_another_clients_request(server: Server) -> None:
    """A replica serves many clients: a request arriving mid-stream waits for the model, and the
    stream runs to its end (llama-cpp-python's default would end it there, with [DONE])."""
    stream = {"model": SERVED_NAME, "prompt": "Once upon a time", "max_tokens": 300, "temperature": 0, "stream": True}
    other = {"model": SERVED_NAME, "prompt": "Hello", "max_tokens": 4}
    with server.client() as client, client.stream("POST", "/v1/completions", json=stream) as response:
        lines = response.iter_lines()
        first = next(line for line in lines if line.startswith("data: "))
        with ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(post, server, "/v1/completions", other)
            events = [first, *(line for line in lines if line.startswith("data: "))]
            assert waiting.result().status_code == 200
    chunks = [json.loads(event[len("data: ") :]) for event in events[:-1]]
    assert events[-1] == "data: [DONE]" and chunks[-1]["choices"][0]["finish_reason"] in ("length", "stop")
