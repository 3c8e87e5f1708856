"""The model servers an inference endpoint's replica runs: one OpenAI-compatible server process
per replica, listening only on a Unix socket that the portal proxies to (no TCP port) where the
portal's proxy runs on the same machine, else (a Slurm node) on the node's address and a port,
behind the replica's API key.

Two kinds: ``llamacpp``, llama.cpp through ``llama-cpp-python``'s server on CPUs, serving a GGUF
file; and ``vllm``, vLLM's OpenAI server on GPUs, serving a Hugging Face model directory. Each
kind's packages are pinned here and built into an environment of their own
(``workers.backends.pyenv.ensure_serve_env``). Everything in this module is pure but
``check_model`` and ``model_file``, which read the model's files.

A server's process must be started with the environment ``command`` returns and nothing of the
portal's own: llama-cpp-python reads its settings from variables with plain names (``MODEL``,
``HOST``, ``PORT``, ``API_KEY``, ``CONFIG_FILE``, ...), whatever their case.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from workers.backends.base import PolicyRefusal


@dataclass(frozen=True)
class ServerKind:
    """A kind of model server: what to install, what it runs on, and how the portal probes it."""

    name: str
    label: str
    requirements: tuple[str, ...]
    needs_gpu: bool
    #: A GET that answers 200 once the model is loaded and the server takes requests.
    health_path: str
    #: Where it publishes Prometheus metrics, or None.
    metrics_path: str | None
    #: What it serves: a single GGUF file, or a Hugging Face model directory.
    model_format: str


# llama-cpp-python's server loads its model in ``create_app``, before uvicorn binds the socket: the
# socket appears once the model is loaded, and /v1/models (it has no /health) answers from then on.
LLAMACPP = ServerKind(
    name="llamacpp",
    label="llama.cpp (CPU)",
    requirements=(
        "llama-cpp-python[server]==0.3.36",
        "diskcache==5.6.3",
        "fastapi==0.165.0",
        "Jinja2==3.1.6",
        "numpy==2.4.6",
        "pydantic==2.14.4",
        "pydantic-settings==2.16.3",
        "PyYAML==6.0.4",
        "sse-starlette==3.7.0",
        "starlette==1.10.0",
        "starlette-context==0.3.6",
        "uvicorn==0.54.0",
    ),
    needs_gpu=False,
    health_path="/v1/models",
    metrics_path=None,
    model_format="gguf",
)
VLLM = ServerKind(
    name="vllm",
    label="vLLM (GPU)",
    requirements=("vllm==0.33.0",),
    needs_gpu=True,
    health_path="/health",
    metrics_path="/metrics",
    model_format="huggingface",
)
SERVERS: dict[str, ServerKind] = {kind.name: kind for kind in (LLAMACPP, VLLM)}

#: The GGUF versions llama.cpp reads (version 1 files are no longer loaded).
GGUF_VERSIONS = (2, 3)
#: Room for a Unix socket's path in ``struct sockaddr_un`` on Linux, its final NUL excluded.
MAX_SOCKET_PATH = 107
#: llama-cpp-python's context size unless an extra argument sets one: small, so that a model
#: trained on a long context does not reserve memory for all of it.
DEFAULT_N_CTX = 2048

# llama-cpp-python's model settings an administrator may set, as ``--name value`` (the server's
# own command-line spelling), passed to the server as the variable NAME.
# fmt: off
LLAMACPP_OPTIONS = frozenset({
    "n_ctx", "n_batch", "n_ubatch", "n_threads", "n_threads_batch", "n_gpu_layers", "split_mode",
    "main_gpu", "tensor_split", "seed", "rope_scaling_type", "rope_freq_base", "rope_freq_scale",
    "yarn_ext_factor", "yarn_attn_factor", "yarn_beta_fast", "yarn_beta_slow", "yarn_orig_ctx",
    "mul_mat_q", "logits_all", "embedding", "offload_kqv", "flash_attn", "last_n_tokens_size",
    "numa", "chat_format", "chat_template_kwargs", "cache", "cache_type", "cache_size", "type_k",
    "type_v", "use_mmap", "use_mlock", "verbose", "interrupt_requests", "disable_ping_events",
    "draft_model", "draft_model_num_pred_tokens", "kv_overrides",
})
# What would change where a server listens, who may call it, what it serves, or what it connects
# to (rpc_servers: llama.cpp's remote workers; config_file: a file of settings, these included).
LLAMACPP_REFUSED = frozenset({
    "host", "port", "uds", "fd", "model", "model_alias", "config_file", "api_key", "ssl_keyfile",
    "ssl_certfile", "root_path", "lora_base", "lora_path", "clip_model_path",
    "hf_tokenizer_config_path", "hf_pretrained_model_name_or_path", "hf_model_repo_id",
    "vocab_only", "rpc_servers",
})
VLLM_REFUSED = frozenset({
    "--host", "--port", "--uds", "--model", "--served-model-name", "--tokenizer", "--revision",
    "--tokenizer-revision", "--code-revision", "--download-dir", "--hf-config-path", "--config",
    "--api-key", "--ssl-keyfile", "--ssl-certfile", "--ssl-ca-certs", "--ssl-cert-reqs",
    "--root-path", "--lora-modules", "--headless",
})
# fmt: on


def command(
    kind: str,
    *,
    model_path: str,
    socket_path: str = "",
    served_name: str,
    cpu_cores: int,
    extra_args: Sequence[str] = (),
    api_key: str = "",
    host: str = "",
    port: str = "",
) -> tuple[list[str], dict[str, str]]:
    """The argv and environment that run a ``kind`` server of the model at ``model_path`` (for
    llamacpp the GGUF file itself: see ``model_file``) under the name ``served_name``, listening
    on the Unix socket ``socket_path`` and nothing else. ``argv[0]`` (``python``, ``vllm``) is the one of the
    server's environment: run it with that environment's ``bin`` first on PATH, in a working
    directory holding nothing the server could import instead of its own. The environment
    returned is the whole of what the server needs beyond PATH and HOME; ``PolicyRefusal`` if
    ``extra_args`` would change where it listens or what it serves. ``api_key``: the replica's own
    secret, which every request must bring (``Authorization: Bearer``; the portal's proxy adds it):
    in the environment only, never on the command line.

    ``host`` and ``port`` instead of ``socket_path``: listen on TCP there, where the proxy runs on
    another machine (a Slurm node). Any process of that machine can then connect: the ``api_key``
    is required. They are put in ``argv`` as given, so that a caller that runs it through a shell
    may give shell words expanded where it runs (``"$MASTER_PORT"``)."""
    server = _server(kind)
    if bool(socket_path) == bool(host and port):
        raise ValueError("a server listens on a Unix socket (socket_path) or on TCP (host and port): give one")
    if host and not api_key:
        raise ValueError("a server on TCP takes an api_key: any process of its machine can connect to it")
    if len(socket_path.encode()) > MAX_SOCKET_PATH:
        raise PolicyRefusal(f"the socket path {socket_path!r} is longer than {MAX_SOCKET_PATH} bytes")
    reason = check_extra_args(kind, extra_args)
    if reason is not None:
        raise PolicyRefusal(reason)
    listen = ["--uds", socket_path] if socket_path else ["--host", host, "--port", port]
    threads = str(max(1, cpu_cores))
    env = {"OMP_NUM_THREADS": threads}
    if server is VLLM:
        argv = ["vllm", "serve", model_path, *listen, "--served-model-name", served_name, *extra_args]
        # The model is on disk: nothing is fetched from a hub, and no usage report is sent.
        env |= {"HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
        if api_key:
            env["VLLM_API_KEY"] = api_key
        return argv, env
    env |= {"MODEL": model_path, "MODEL_ALIAS": served_name, "N_CTX": str(DEFAULT_N_CTX)}
    env |= {"N_THREADS": threads, "N_THREADS_BATCH": threads}
    # Its default ends a stream as soon as another request waits for the model: a replica serves
    # many clients, whose requests queue instead.
    env |= {"INTERRUPT_REQUESTS": "false"}
    env |= _llamacpp_settings(extra_args)
    if api_key:
        env["API_KEY"] = api_key
    # -I: no PYTHON* variable and no working directory on sys.path (-u: unbuffered logs). uvicorn
    # still puts its --app-dir, the working directory, first on sys.path: run it in one of its own.
    argv = ["python", "-I", "-u", "-m", "uvicorn", "--factory", "llama_cpp.server.app:create_app", *listen]
    return [*argv, "--workers", "1", "--log-level", "info", "--no-access-log"], env


def check_extra_args(kind: str, extra_args: Sequence[str]) -> str | None:
    """None if ``extra_args`` may be appended to a ``kind`` server's command, else why not."""
    _server(kind)
    for arg in extra_args:
        if not isinstance(arg, str) or "\0" in arg or "\n" in arg:
            return f"{arg!r} is not a single-line argument"
    if kind == VLLM.name:
        return _check_vllm_args(extra_args)
    try:
        _llamacpp_settings(extra_args)
    except PolicyRefusal as refusal:
        return str(refusal)
    return None


def _check_vllm_args(extra_args: Sequence[str]) -> str | None:
    for arg in extra_args:
        if not arg.startswith("--"):
            continue  # an option's value, or a short option (-tp 2), none of which is refused
        name = arg.split("=", 1)[0].replace("_", "-")
        if name == "--":
            return "'--' would make the next arguments positional (a second model): remove it"
        # argparse takes a prefix of an option for the option (--po for --port): refuse those too.
        refused = sorted(option for option in VLLM_REFUSED if option.startswith(name))
        if refused:
            return f"{arg!r} would set {refused[0]}: the portal sets where the server listens and what it serves"
    return None


def _llamacpp_settings(extra_args: Sequence[str]) -> dict[str, str]:
    """``--name value`` or ``--name=value`` pairs as the variables llama-cpp-python reads."""
    settings: dict[str, str] = {}
    args = list(extra_args)
    while args:
        arg = args.pop(0)
        if not arg.startswith("--"):
            raise PolicyRefusal(f"{arg!r} is not an option: give options as --name value, e.g. --n_ctx 4096")
        name, has_value, value = arg[2:].partition("=")
        name = name.replace("-", "_").lower()
        if name in LLAMACPP_REFUSED:
            raise PolicyRefusal(
                f"--{name} is set by the portal: it decides where the server listens and what it serves"
            )
        if name not in LLAMACPP_OPTIONS:
            raise PolicyRefusal(f"--{name} is not a model option of the llama.cpp server")
        if not has_value:
            if not args:
                raise PolicyRefusal(f"--{name} needs a value")
            value = args.pop(0)
        settings[name.upper()] = value
    return settings


def check_model(kind: str, path: Path) -> str | None:
    """None if ``path`` holds a model a ``kind`` server can load, else a sentence saying why not:
    llamacpp wants a GGUF file (or a directory holding exactly one), vllm a Hugging Face model
    directory (config.json naming its architectures, and weights)."""
    server = _server(kind)
    path = Path(path)
    if not path.exists():
        return f"{path} does not exist."
    if server is VLLM:
        return _check_hf_directory(path)
    try:
        return _check_gguf(model_file(kind, path))
    except PolicyRefusal as refusal:
        return str(refusal)


def model_file(kind: str, path: Path) -> Path:
    """What a ``kind`` server is given to load from ``path``: for llamacpp the GGUF file, the one
    in ``path`` if it is a directory (``PolicyRefusal`` if it holds none or several); for vllm
    ``path`` itself."""
    if _server(kind) is VLLM or not path.is_dir():
        return path
    found = sorted(p for p in path.iterdir() if p.suffix == ".gguf" and p.is_file())
    if len(found) != 1:
        names = ", ".join(p.name for p in found[:3])
        what = "no .gguf file" if not found else f"{len(found)} .gguf files ({names}): name the one to serve"
        raise PolicyRefusal(f"{path} holds {what}.")
    return found[0]


def _check_gguf(path: Path) -> str | None:
    try:
        with open(path, "rb") as f:
            head = f.read(8)
    except OSError as exc:
        return f"{path} cannot be read: {exc.strerror}."
    if len(head) < 8 or head[:4] != b"GGUF":
        return f"{path} is not a GGUF file (llama.cpp serves GGUF models; convert it with llama.cpp's tools)."
    (version,) = struct.unpack("<I", head[4:])
    if version not in GGUF_VERSIONS:
        return f"{path} is a GGUF file of version {version}, which llama.cpp does not read (it reads {GGUF_VERSIONS})."
    return None


def _check_hf_directory(path: Path) -> str | None:
    if not path.is_dir():
        return f"{path} is not a directory: vLLM serves a Hugging Face model directory."
    config = path / "config.json"
    if not config.is_file():
        return f"{path} has no config.json: it is not a Hugging Face model directory."
    try:
        data = json.loads(config.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return f"{config} is not valid JSON."
    architectures = data.get("architectures") if isinstance(data, dict) else None
    if not isinstance(architectures, list) or not architectures:
        return f"{config} names no architectures, so vLLM cannot tell which model to build."
    if not any(path.glob("*.safetensors")) and not any(path.glob("*.bin")):
        return f"{path} has no weights (*.safetensors or *.bin files)."
    return None


def _server(kind: str) -> ServerKind:
    try:
        return SERVERS[kind]
    except KeyError:
        raise PolicyRefusal(f"{kind!r} is not a server kind (one of {', '.join(SERVERS)})") from None
