"""The model servers' commands and checks (workers/backends/servers.py), without starting one: the
vLLM command's shape, what extra arguments an administrator may add, and which paths hold a model
each kind of server can load."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.inference.tinymodel import write_tiny_gguf
from workers.backends import servers
from workers.backends.base import PolicyRefusal


def vllm_command(*extra: str) -> tuple[list[str], dict[str, str]]:
    return servers.command(
        "vllm", model_path="/models/qwen", socket_path="/run/r1.sock", served_name="qwen", cpu_cores=4, extra_args=extra
    )


def test_it_runs_vllm_on_the_socket_under_the_served_name() -> None:
    argv, env = vllm_command("--max-model-len", "4096", "-tp", "2")
    assert argv == [
        "vllm", "serve", "/models/qwen", "--uds", "/run/r1.sock", "--served-model-name", "qwen",
        "--max-model-len", "4096", "-tp", "2",
    ]  # fmt: skip
    assert "--host" not in argv and "--port" not in argv
    assert env["HF_HUB_OFFLINE"] == "1" and env["VLLM_NO_USAGE_STATS"] == "1" and env["OMP_NUM_THREADS"] == "4"


def test_it_runs_llamacpp_on_the_socket_with_its_settings_in_the_environment() -> None:
    argv, env = servers.command(
        "llamacpp", model_path="/m/tiny.gguf", socket_path="/run/r1.sock", served_name="tiny", cpu_cores=3,
        extra_args=["--n_ctx", "512", "--chat-format=chatml"],
    )  # fmt: skip
    assert argv[:7] == ["python", "-I", "-u", "-m", "uvicorn", "--factory", "llama_cpp.server.app:create_app"]
    assert argv[argv.index("--uds") + 1] == "/run/r1.sock" and "--port" not in argv and "--host" not in argv
    assert env["MODEL"] == "/m/tiny.gguf" and env["MODEL_ALIAS"] == "tiny"
    assert env["N_THREADS"] == env["N_THREADS_BATCH"] == "3"
    assert env["N_CTX"] == "512" and env["CHAT_FORMAT"] == "chatml"
    assert env["INTERRUPT_REQUESTS"] == "false"  # one client's stream is not cut short by another's request


@pytest.mark.parametrize("kind", ["llamacpp", "vllm"])
@pytest.mark.parametrize(
    "args", [["--port", "8000"], ["--host=0.0.0.0"], ["--uds", "/tmp/other.sock"], ["--model", "/other"]]
)
def test_extra_args_cannot_change_where_it_listens_or_what_it_serves(kind: str, args: list[str]) -> None:
    reason = servers.check_extra_args(kind, args)
    assert reason is not None and args[0].split("=")[0] in reason
    with pytest.raises(PolicyRefusal):
        servers.command(kind, model_path="/m", socket_path="/s.sock", served_name="m", cpu_cores=1, extra_args=args)


@pytest.mark.parametrize(
    "args", [["--po", "8000"], ["--served_model_name", "other"], ["--lora-modules", "x=/l"], ["--config", "c.yaml"]]
)
def test_vllm_refuses_abbreviations_and_other_spellings_of_what_the_portal_sets(args: list[str]) -> None:
    assert servers.check_extra_args("vllm", args) is not None


def test_vllm_takes_its_tuning_options() -> None:
    args = ["--gpu-memory-utilization", "0.8", "--max-model-len=8192", "--tensor-parallel-size", "2", "--enforce-eager"]
    assert servers.check_extra_args("vllm", args) is None


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--api_key", "k"], "set by the portal"),
        (["--lora_path", "/x"], "set by the portal"),
        (["--frobnicate", "1"], "not a model option"),
        (["n_ctx", "1"], "not an option"),
        (["--n_ctx"], "needs a value"),
    ],
)
def test_llamacpp_takes_only_its_model_options(args: list[str], words: str) -> None:
    assert words in (servers.check_extra_args("llamacpp", args) or "")


def test_a_socket_path_too_long_for_a_unix_socket_is_refused() -> None:
    with pytest.raises(PolicyRefusal, match="longer than 107"):
        servers.command(
            "vllm", model_path="/m", socket_path="/" + "s" * 120, served_name="m", cpu_cores=1, extra_args=()
        )


def hf_directory(root: Path, config: object = None, weights: str | None = "model.safetensors") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama"} if config is None else config
    (root / "config.json").write_text(json.dumps(config))
    if weights:
        (root / weights).write_bytes(b"\0" * 16)
    return root


def test_vllm_loads_a_hugging_face_directory(tmp_path: Path) -> None:
    assert servers.check_model("vllm", hf_directory(tmp_path / "st")) is None
    assert servers.check_model("vllm", hf_directory(tmp_path / "bin", weights="pytorch_model.bin")) is None


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (lambda p: p, "does not exist"),
        (lambda p: (p.mkdir(), p)[1], "has no config.json"),
        (lambda p: (p.write_text("hello\n"), p)[1], "is not a directory"),
        (lambda p: hf_directory(p, weights=None), "has no weights"),
        (lambda p: hf_directory(p, config={"model_type": "llama"}), "names no architectures"),
        (lambda p: hf_directory(p, config=["not", "an", "object"]), "names no architectures"),
    ],
)
def test_vllm_says_why_a_path_holds_no_model(tmp_path: Path, make: object, words: str) -> None:
    path = make(tmp_path / "model")  # type: ignore[operator]
    reason = servers.check_model("vllm", path)
    assert reason is not None and words in reason and str(path) in reason


def test_vllm_says_a_broken_config_is_not_json(tmp_path: Path) -> None:
    model = hf_directory(tmp_path / "model")
    (model / "config.json").write_text("{architectures")
    assert "is not valid JSON" in (servers.check_model("vllm", model) or "")


def test_llamacpp_loads_a_gguf_file_or_a_directory_holding_one(tmp_path: Path) -> None:
    model = write_tiny_gguf(tmp_path / "tiny.gguf")
    assert servers.check_model("llamacpp", model) is None
    assert servers.check_model("llamacpp", tmp_path) is None
    assert servers.model_file("llamacpp", tmp_path) == model


@pytest.mark.parametrize(
    ("content", "words"),
    [(b"", "is not a GGUF file"), (b"hello, world\n", "is not a GGUF file"), (b"GGUF\x01\0\0\0", "version 1")],
)
def test_llamacpp_says_why_a_file_is_no_model(tmp_path: Path, content: bytes, words: str) -> None:
    path = tmp_path / "model.gguf"
    path.write_bytes(content)
    assert words in (servers.check_model("llamacpp", path) or "")


def test_llamacpp_wants_exactly_one_gguf_in_a_directory(tmp_path: Path) -> None:
    assert "holds no .gguf file" in (servers.check_model("llamacpp", tmp_path) or "")
    write_tiny_gguf(tmp_path / "a.gguf")
    write_tiny_gguf(tmp_path / "b.gguf")
    assert "holds 2 .gguf files" in (servers.check_model("llamacpp", tmp_path) or "")
    assert "does not exist" in (servers.check_model("llamacpp", tmp_path / "gone") or "")
