"""Write a tiny random Llama that vLLM can serve, built from nothing but this repository.

Run by the vLLM venv's python (it needs ``torch``, ``transformers`` and ``tokenizers``,
which vLLM brings)::

    python tests/servers/build_tiny_llama.py OUT_DIR

``OUT_DIR`` then holds a Hugging Face model directory: a 2-layer, 128-wide Llama with
random weights (seeded: the same weights on every build) and a byte-level BPE tokenizer
of ``VOCAB`` tokens trained on the repository's own ``docs/*.md`` (read in name order:
the same checkout gives the same tokenizer), with a chat template so that
``/v1/chat/completions`` works. Nothing is downloaded. The model's answers are
meaningless token sequences: it exists to measure a server's streaming, not its text.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SEED = 1234
VOCAB = 1024
SPECIAL = ("<s>", "</s>", "<pad>")
# one line per message, then the assistant's turn: what vLLM renders before tokenizing
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<{{ m['role'] }}> {{ m['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}<assistant> {% endif %}"
)


def corpus() -> list[str]:
    """The training text: every docs/*.md of the checkout, in name order."""
    files = sorted((REPO / "docs").glob("*.md"))
    if not files:
        raise SystemExit(f"no docs/*.md under {REPO}: nothing to train the tokenizer on")
    return [f.read_text(encoding="utf-8") for f in files]


def train_tokenizer():  # -> tokenizers.Tokenizer
    """The byte-level BPE of ``VOCAB`` tokens, trained on ``corpus()`` (``tokenizers`` only)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=list(SPECIAL),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    return tok


def build_tokenizer(out: Path):  # -> transformers.PreTrainedTokenizerFast
    from transformers import PreTrainedTokenizerFast

    tok = train_tokenizer()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    return fast


def build_model(out: Path, vocab_size: int, tokenizer) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(SEED)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,  # head size 64: one every vLLM attention backend takes
        num_key_value_heads=2,
        max_position_embeddings=2048,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
        torch_dtype="float32",
    )
    model = LlamaForCausalLM(config)
    model.save_pretrained(out, safe_serialization=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the model directory to write")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(args.out)
    build_model(args.out, len(tokenizer), tokenizer)
    print(f"wrote {args.out} (vocab {len(tokenizer)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
