"""A tiny llama-architecture model with random weights, written as GGUF at test time: what the
inference tests serve, so that they download nothing and a CPU loads it in milliseconds.

Its vocabulary is SentencePiece-like: the special tokens, the 256 byte tokens llama.cpp falls back
on for any text, and the printable ASCII characters. Its chat template makes /v1/chat/completions
work as with a real model's. The weights come from a seeded generator: the same file every time.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

VOCAB_SPECIAL = ["<unk>", "<s>", "</s>"]
UNK_ID, BOS_ID, EOS_ID = 0, 1, 2
N_EMBD = 64
N_FF = 128
N_HEAD = 4
N_LAYER = 2
N_CTX_TRAIN = 512
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|' + message['role'] + '|>\\n' + message['content'] + eos_token + '\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)


def vocabulary() -> tuple[list[str], list[float], list[int]]:
    """The tokens, their scores and their types."""
    tokens = list(VOCAB_SPECIAL)
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    tokens += [f"<0x{byte:02X}>" for byte in range(256)]
    types += [gguf.TokenType.BYTE] * 256
    normal = ["\u2581", *(chr(c) for c in range(0x21, 0x7F))]  # "▁" is SentencePiece's space
    tokens += normal
    types += [gguf.TokenType.NORMAL] * len(normal)
    scores = [0.0] * (len(tokens) - len(normal)) + [-float(i) for i in range(len(normal))]
    return tokens, scores, [int(t) for t in types]


def write_tiny_gguf(path: Path, seed: int = 0) -> Path:
    """Write the tiny model to ``path`` (a .gguf file) and return ``path``."""
    tokens, scores, types = vocabulary()
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny-random-llama")
    writer.add_context_length(N_CTX_TRAIN)
    writer.add_embedding_length(N_EMBD)
    writer.add_feed_forward_length(N_FF)
    writer.add_block_count(N_LAYER)
    writer.add_head_count(N_HEAD)
    writer.add_head_count_kv(N_HEAD)
    writer.add_rope_dimension_count(N_EMBD // N_HEAD)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(len(tokens))
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_unk_token_id(UNK_ID)
    writer.add_bos_token_id(BOS_ID)
    writer.add_eos_token_id(EOS_ID)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)
    for name, tensor in _weights(len(tokens), np.random.default_rng(seed)):
        writer.add_tensor(name, tensor)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _weights(n_vocab: int, rng: np.random.Generator) -> list[tuple[str, np.ndarray]]:
    """The model's tensors, shaped as numpy sees them (rows x columns; GGUF stores them reversed)."""

    def matrix(rows: int, columns: int) -> np.ndarray:
        return (rng.standard_normal((rows, columns)) * 0.1).astype(np.float32)

    def ones() -> np.ndarray:
        return np.ones(N_EMBD, dtype=np.float32)

    weights = [("token_embd.weight", matrix(n_vocab, N_EMBD))]
    for layer in range(N_LAYER):
        block = f"blk.{layer}"
        weights += [
            (f"{block}.attn_norm.weight", ones()),
            (f"{block}.attn_q.weight", matrix(N_EMBD, N_EMBD)),
            (f"{block}.attn_k.weight", matrix(N_EMBD, N_EMBD)),
            (f"{block}.attn_v.weight", matrix(N_EMBD, N_EMBD)),
            (f"{block}.attn_output.weight", matrix(N_EMBD, N_EMBD)),
            (f"{block}.ffn_norm.weight", ones()),
            (f"{block}.ffn_gate.weight", matrix(N_FF, N_EMBD)),
            (f"{block}.ffn_up.weight", matrix(N_FF, N_EMBD)),
            (f"{block}.ffn_down.weight", matrix(N_EMBD, N_FF)),
        ]
    return [*weights, ("output_norm.weight", ones()), ("output.weight", matrix(n_vocab, N_EMBD))]
