"""``python -m sxwl.engine.merge BASE ADAPTER OUT``: the base model with a LoRA adapter merged into
its weights, for ``transformers serve``, which loads one model directory (vLLM loads the adapter
itself, with --enable-lora). Run in its own process so the supervisor never holds torch."""

from __future__ import annotations

import sys
from pathlib import Path


def merge(base: Path, adapter: Path, out: Path) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(base)
    merged = PeftModel.from_pretrained(model, adapter).merge_and_unload()
    partial = out.with_name(out.name + ".partial")
    merged.save_pretrained(partial, safe_serialization=True)
    tokenizer_dir = adapter if (adapter / "tokenizer_config.json").exists() else base
    AutoTokenizer.from_pretrained(tokenizer_dir).save_pretrained(partial)
    partial.rename(out)  # whole or not at all: a restarted supervisor merges again


if __name__ == "__main__":
    merge(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]))
