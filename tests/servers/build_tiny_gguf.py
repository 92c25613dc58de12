"""Write a tiny random Llama as one GGUF file, for llama.cpp's servers, from nothing but
this repository.

Run by a python that has ``gguf``, ``numpy`` and ``tokenizers`` (llama-cpp-python's venv
with those two added: bench/llama_cpp_peer.py says how)::

    python tests/servers/build_tiny_gguf.py OUT.gguf

The model is tests/servers/build_tiny_llama.py's shape (2 layers, 128 wide, 2 heads,
SwiGLU 256) with seeded random float32 weights written straight in llama.cpp's tensor
names, and the same byte-level BPE of ``VOCAB`` tokens trained on the checkout's
``docs/*.md`` (tokenizer model ``gpt2``, GPT-2's pre-tokenizer), with the same chat
template. Nothing is downloaded or converted. Its answers are meaningless token
sequences: it exists to measure a server's streaming, not its text.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from build_tiny_llama import CHAT_TEMPLATE, SEED, SPECIAL, train_tokenizer

HIDDEN, FFN, LAYERS, HEADS, CONTEXT = 128, 256, 2, 2, 2048


def tokenizer() -> tuple[list[str], list[str]]:
    """(tokens in id order, merges "a b"): the byte-level BPE of build_tiny_llama.py."""
    tok = train_tokenizer()
    model = json.loads(tok.to_str())["model"]
    vocab: dict[str, int] = model["vocab"]
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    return tokens, merges


def write(out: Path) -> int:
    import gguf
    import numpy as np

    tokens, merges = tokenizer()
    rng = np.random.default_rng(SEED)

    def weight(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    w = gguf.GGUFWriter(str(out), "llama")
    w.add_name("tiny-random-llama")
    w.add_context_length(CONTEXT)
    w.add_embedding_length(HIDDEN)
    w.add_block_count(LAYERS)
    w.add_feed_forward_length(FFN)
    w.add_rope_dimension_count(HIDDEN // HEADS)
    w.add_head_count(HEADS)
    w.add_head_count_kv(HEADS)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(tokens)
    w.add_token_types(
        [gguf.TokenType.CONTROL if t in SPECIAL else gguf.TokenType.NORMAL for t in tokens]
    )
    w.add_token_merges(merges)
    w.add_bos_token_id(tokens.index("<s>"))
    w.add_eos_token_id(tokens.index("</s>"))
    w.add_pad_token_id(tokens.index("<pad>"))
    w.add_add_bos_token(False)  # the chat template writes it
    w.add_chat_template(CHAT_TEMPLATE)

    n = len(tokens)
    embd = weight(n, HIDDEN)
    w.add_tensor("token_embd.weight", embd)
    for i in range(LAYERS):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(HIDDEN, np.float32))
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            w.add_tensor(f"blk.{i}.{name}.weight", weight(HIDDEN, HIDDEN))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(HIDDEN, np.float32))
        w.add_tensor(f"blk.{i}.ffn_gate.weight", weight(FFN, HIDDEN))
        w.add_tensor(f"blk.{i}.ffn_up.weight", weight(FFN, HIDDEN))
        w.add_tensor(f"blk.{i}.ffn_down.weight", weight(HIDDEN, FFN))
    w.add_tensor("output_norm.weight", np.ones(HIDDEN, np.float32))
    w.add_tensor("output.weight", embd)  # tied, as the Hugging Face model's

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return n


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the .gguf file to write")
    args = parser.parse_args(argv)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    n = write(args.out)
    print(f"wrote {args.out} (vocab {n})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
