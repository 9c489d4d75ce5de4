"""``python -m sxwl.trainer.tiny [OUT_DIR] [--dataset FILE] [--seed N]``: a tiny Llama (a few hundred
thousand parameters) with a byte-level BPE tokenizer trained on a built-in English and Chinese
corpus, saved as a hub model directory, built offline in seconds and the same for the same seed;
and ``sample_dataset``, a toy chat dataset for it. The demo, the tests and the GPU check train
these; the demo runs this in a process of its own, so the cloud never loads the training stack."""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
from transformers.utils import logging as hf_logging

BOS, EOS, PAD = "<|bos|>", "<|eos|>", "<|pad|>"
ROLE_TOKENS = ["<|system|>", "<|user|>", "<|assistant|>"]
# The same shape as data.simple_format, with the role tags as special tokens. The newline after
# a block tag is spelled out: transformers renders templates with trim_blocks.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}"
    "{% if m['role'] == 'assistant' %}{{ eos_token }}{% endif %}{{ '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

# English word, its Chinese: the toy task's vocabulary and most of the tokenizer's corpus.
WORDS = [
    ("cat", "猫"), ("dog", "狗"), ("water", "水"), ("fire", "火"), ("mountain", "山"),
    ("river", "河"), ("sun", "太阳"), ("moon", "月亮"), ("tree", "树"), ("flower", "花"),
    ("bird", "鸟"), ("fish", "鱼"), ("rice", "米饭"), ("tea", "茶"), ("book", "书"),
    ("cloud", "云"), ("rain", "雨"), ("snow", "雪"), ("wind", "风"), ("horse", "马"),
]  # fmt: skip
CORPUS = [
    "The cloud trains language models on GPUs that providers lend.",
    "A fine-tune adapts a base model to a task with a small adapter.",
    "Translate to Chinese. Translate to English. Answer in one word.",
    "算想云是一个开放的大模型训练云。",
    "微调让基础模型学会一个新任务。",
    "把这个词翻译成中文。把这个词翻译成英文。",
    "You are a helpful assistant. 你是一个乐于助人的助手。",
]


def corpus() -> list[str]:
    lines = list(CORPUS)
    for en, zh in WORDS:
        lines += [f"Translate to Chinese: {en}", zh, f"Translate to English: {zh}", en, f"{en} {zh}"]
    return lines


def build_tokenizer(vocab_size: int) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[PAD, BOS, EOS, *ROLE_TOKENS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        additional_special_tokens=ROLE_TOKENS,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build(
    out_dir: Path,
    *,
    seed: int = 0,
    hidden_size: int = 64,
    layers: int = 2,
    heads: int = 4,
    vocab_size: int = 512,
) -> Path:
    """Writes the model directory; the defaults give about 200k parameters."""
    # A bar per file saved, on a log that is read.
    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(vocab_size)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 4,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=1024,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def sample_dataset(path: Path, n: int = 40, *, seed: int = 0) -> Path:
    """``n`` chat examples of the toy task: translate a word between English and Chinese."""
    rng = random.Random(seed)  # noqa: S311 (a toy dataset)
    with path.open("w", encoding="utf-8") as f:
        for i in range(n):
            en, zh = WORDS[i % len(WORDS)]
            to_zh = (i // len(WORDS)) % 2 == 0 if n > len(WORDS) else rng.random() < 0.5
            question, answer = (
                (f"Translate to Chinese: {en}", zh) if to_zh else (f"Translate to English: {zh}", en)
            )
            messages = [
                {"role": "system", "content": "Answer in one word."},
                {"role": "user", "content": question},
                {"role": "assistant", "content": answer},
            ]
            f.write(json.dumps({"messages": messages}, ensure_ascii=False) + "\n")
    return path


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m sxwl.trainer.tiny", description=__doc__)
    parser.add_argument("out_dir", type=Path, nargs="?", help="build the model here")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dataset", type=Path, help="write the sample dataset to this file")
    parser.add_argument("--examples", type=int, default=40, help="of the sample dataset")
    args = parser.parse_args(argv)
    if args.out_dir is None and args.dataset is None:
        parser.error("give OUT_DIR, --dataset FILE, or both")
    if args.out_dir is not None:
        build(args.out_dir, seed=args.seed)
        print(args.out_dir)
    if args.dataset is not None:
        print(sample_dataset(args.dataset, n=args.examples, seed=args.seed))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
