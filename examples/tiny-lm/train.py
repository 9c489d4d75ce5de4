#!/usr/bin/env python3
"""tiny-lm: trains a small character-level language model on the text beside this script.

A real (if small) training job for 算想云 (sxwl). It prints ``step N loss X`` every step, writes a
checkpoint and ``metrics.json`` into ``$SXWL_OUTPUT_DIR`` (``./output`` when unset), and ends with
a short sample of generated text.

Two implementations of the same job:

- ``numpy``: a Bengio-style MLP (embeddings of the previous characters -> tanh hidden layer ->
  softmax over the vocabulary) with hand-written backpropagation and Adam. Runs anywhere numpy does;
  the default 200 steps take a few seconds on two CPU cores.
- ``torch``: a tiny GPT (causal self-attention) trained with AdamW, used when PyTorch is installed
  and a CUDA GPU is visible (``CUDA_VISIBLE_DEVICES``, which the sxwl agent sets for the job).

Self-contained on purpose: the standard library plus numpy or PyTorch, so a job can run it from any
working directory.

    python3 train.py [--steps 200] [--seed 1337] [--backend auto|numpy|torch] [--data FILE]

Every flag also reads an environment variable (``TINY_LM_STEPS``, ``TINY_LM_SEED``,
``TINY_LM_BACKEND``, ...), so a job's ``env`` can change it without touching the command.
On SIGTERM (a cancel, or the job's max runtime) it stops after the current step and still writes
its checkpoint and metrics, marked ``"interrupted": true``, then exits with status 143.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from types import FrameType
from typing import Any

HERE = Path(__file__).resolve().parent
SIGTERM_EXIT = 128 + signal.SIGTERM


# ---- configuration ---------------------------------------------------------------------------------


def _env(name: str, default: str) -> str:
    return os.environ.get(f"TINY_LM_{name}", default)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Train a small character-level language model (numpy, or PyTorch on CUDA)."
    )
    parser.add_argument("--steps", type=int, default=int(_env("STEPS", "200")), help="training steps (200)")
    parser.add_argument("--seed", type=int, default=int(_env("SEED", "1337")), help="random seed (1337)")
    parser.add_argument(
        "--backend",
        choices=("auto", "numpy", "torch"),
        default=_env("BACKEND", "auto"),
        help="auto: torch when CUDA is available, else numpy; torch without CUDA runs on the CPU",
    )
    parser.add_argument("--data", type=Path, default=Path(_env("DATA", str(HERE / "input.txt"))))
    parser.add_argument(
        "--output",
        type=Path,
        default=Path(os.environ.get("SXWL_OUTPUT_DIR") or "output"),
        help="where the checkpoint and metrics go (default: $SXWL_OUTPUT_DIR, else ./output)",
    )
    parser.add_argument("--batch-size", type=int, default=int(_env("BATCH_SIZE", "0")), help="0: per backend")
    parser.add_argument("--lr", type=float, default=float(_env("LR", "0")), help="0: per backend")
    parser.add_argument("--sample-chars", type=int, default=int(_env("SAMPLE_CHARS", "240")))
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error("--steps must be at least 1")
    if args.batch_size < 0 or args.lr < 0 or args.sample_chars < 0:
        parser.error("--batch-size, --lr and --sample-chars must not be negative")
    return args


@dataclass(frozen=True)
class Corpus:
    text: str
    chars: list[str]

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> list[int]:
        index = {c: i for i, c in enumerate(self.chars)}
        return [index[c] for c in text if c in index]

    def decode(self, ids: list[int]) -> str:
        return "".join(self.chars[i] for i in ids)


def load_corpus(path: Path) -> Corpus:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        sys.exit(f"tiny-lm: cannot read the training text {path}: {exc.strerror or exc}")
    if len(text) < 1000:
        sys.exit(f"tiny-lm: {path} holds {len(text)} characters; give it at least 1000")
    return Corpus(text, sorted(set(text)))


class Stop:
    """Set by SIGTERM: the loop ends after its current step and the results are still written."""

    def __init__(self) -> None:
        self.requested = False
        signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, _signum: int, _frame: FrameType | None) -> None:
        if not self.requested:
            print("tiny-lm: SIGTERM received; stopping after this step", flush=True)
        self.requested = True


@dataclass
class Result:
    backend: str
    device: str
    steps: int
    first_loss: float
    final_loss: float
    val_loss: float
    seconds: float
    tokens: int
    params: int
    checkpoint: str
    sample: str
    interrupted: bool


def lr_at(step: int, steps: int, peak: float) -> float:
    """Linear warm-up over the first 5% of steps, then cosine decay to a tenth of the peak."""
    warmup = max(1, steps // 20)
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


# ---- numpy: an MLP with hand-written backpropagation ------------------------------------------------


def train_numpy(args: argparse.Namespace, corpus: Corpus, stop: Stop) -> Result:
    import numpy as np

    context, embed, hidden = 16, 24, 384
    batch = args.batch_size or 128
    peak_lr = args.lr or 5e-3
    rng = np.random.default_rng(args.seed)
    data = np.array(corpus.encode(corpus.text), dtype=np.int64)
    split = int(len(data) * 0.9)
    train, val = data[:split], data[split:]
    vocab = corpus.vocab_size
    f32 = np.float32

    params: dict[str, Any] = {
        "E": (rng.standard_normal((vocab, embed)) * 0.5).astype(f32),
        "W1": (rng.standard_normal((context * embed, hidden)) * (5 / 3) / math.sqrt(context * embed)).astype(
            f32
        ),
        "b1": np.zeros(hidden, dtype=f32),
        "W2": (rng.standard_normal((hidden, vocab)) * 0.01).astype(f32),
        "b2": np.zeros(vocab, dtype=f32),
    }
    moments = {k: (np.zeros_like(v), np.zeros_like(v)) for k, v in params.items()}
    beta1, beta2, eps = 0.9, 0.99, 1e-8
    offsets = np.arange(context)

    def windows(source: Any, starts: Any) -> tuple[Any, Any]:
        return source[starts[:, None] + offsets], source[starts + context]

    def forward(x_ids: Any, y: Any) -> tuple[float, dict[str, Any]]:
        x = params["E"][x_ids].reshape(len(x_ids), -1)
        h = np.tanh(x @ params["W1"] + params["b1"])
        logits = h @ params["W2"] + params["b2"]
        logits -= logits.max(axis=1, keepdims=True)
        exp = np.exp(logits)
        probs = exp / exp.sum(axis=1, keepdims=True)
        loss = float(-np.log(probs[np.arange(len(y)), y] + 1e-12).mean())
        return loss, {"x": x, "h": h, "probs": probs}

    def backward(x_ids: Any, y: Any, cache: dict[str, Any]) -> dict[str, Any]:
        n = len(y)
        dlogits = cache["probs"]
        dlogits[np.arange(n), y] -= 1
        dlogits /= n
        grads = {"W2": cache["h"].T @ dlogits, "b2": dlogits.sum(axis=0)}
        dpre = (dlogits @ params["W2"].T) * (1 - cache["h"] ** 2)
        grads["W1"] = cache["x"].T @ dpre
        grads["b1"] = dpre.sum(axis=0)
        dx = (dpre @ params["W1"].T).reshape(n, context, embed)
        grads["E"] = np.zeros_like(params["E"])
        np.add.at(grads["E"], x_ids, dx)
        return grads

    print(
        f"tiny-lm numpy MLP: {len(data):,} characters, vocabulary {vocab}, context {context}, "
        f"hidden {hidden}, batch {batch}, {sum(v.size for v in params.values()):,} parameters",
        flush=True,
    )
    first = last = float("nan")
    done = 0
    began = time.perf_counter()
    for step in range(args.steps):
        starts = rng.integers(0, len(train) - context - 1, size=batch)
        x_ids, y = windows(train, starts)
        loss, cache = forward(x_ids, y)
        grads = backward(x_ids, y, cache)
        norm = math.sqrt(sum(float((g * g).sum()) for g in grads.values()))
        scale = 1.0 if norm <= 1.0 else 1.0 / norm  # clip the global gradient norm at 1
        lr = lr_at(step, args.steps, peak_lr)
        t = step + 1
        for key, grad in grads.items():
            m, v = moments[key]
            grad = grad * scale
            m *= beta1
            m += (1 - beta1) * grad
            v *= beta2
            v += (1 - beta2) * grad * grad
            update = (m / (1 - beta1**t)) / (np.sqrt(v / (1 - beta2**t)) + eps)
            params[key] -= (lr * update).astype(f32)
        first = loss if step == 0 else first
        last = loss
        done = t
        print(f"step {t} loss {loss:.4f}", flush=True)
        if stop.requested:
            break
    seconds = time.perf_counter() - began

    starts = np.arange(0, len(val) - context - 1, max(1, (len(val) - context - 1) // 2048))
    val_loss, _ = forward(*windows(val, starts))

    ids = corpus.encode(corpus.text[:context])
    for _ in range(args.sample_chars):
        _, cache = forward(np.array([ids[-context:]]), np.array([0]))
        probs = cache["probs"][0].astype(np.float64) ** (1 / 0.8)  # temperature 0.8
        ids.append(int(rng.choice(vocab, p=probs / probs.sum())))
    sample = corpus.decode(ids[context:])

    args.output.mkdir(parents=True, exist_ok=True)
    checkpoint = args.output / "checkpoint.npz"
    np.savez(
        checkpoint,
        vocab=np.array(corpus.chars),
        config=np.array(json.dumps({"context": context, "embed": embed, "hidden": hidden})),
        **params,
    )
    return Result(
        backend="numpy",
        device="cpu",
        steps=done,
        first_loss=first,
        final_loss=last,
        val_loss=val_loss,
        seconds=seconds,
        tokens=done * batch,
        params=int(sum(v.size for v in params.values())),
        checkpoint=checkpoint.name,
        sample=sample,
        interrupted=stop.requested,
    )


# ---- torch: a tiny GPT ----------------------------------------------------------------------------


def torch_cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def train_torch(args: argparse.Namespace, corpus: Corpus, stop: Stop) -> Result:
    import torch
    from torch import nn
    from torch.nn import functional as F

    torch.manual_seed(args.seed)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    block, n_embd, n_head, n_layer = 128, 192, 6, 4
    batch = args.batch_size or (64 if device.type == "cuda" else 16)
    peak_lr = args.lr or 2e-3
    data = torch.tensor(corpus.encode(corpus.text), dtype=torch.long)
    if len(data) < 4 * block:
        sys.exit(f"tiny-lm: the torch backend needs at least {4 * block} characters of text")
    split = int(len(data) * 0.9)
    train, val = data[:split], data[min(split, len(data) - block - 2) :]
    vocab = corpus.vocab_size
    generator = torch.Generator().manual_seed(args.seed)

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1 = nn.LayerNorm(n_embd)
            self.qkv = nn.Linear(n_embd, 3 * n_embd)
            self.proj = nn.Linear(n_embd, n_embd)
            self.ln2 = nn.LayerNorm(n_embd)
            self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd))

        def forward(self, x: Any) -> Any:
            b, t, c = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(n_embd, dim=2)
            q, k, v = (z.view(b, t, n_head, c // n_head).transpose(1, 2) for z in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(y.transpose(1, 2).contiguous().view(b, t, c))
            return x + self.mlp(self.ln2(x))

    class GPT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tok = nn.Embedding(vocab, n_embd)
            self.pos = nn.Embedding(block, n_embd)
            self.blocks = nn.Sequential(*(Block() for _ in range(n_layer)))
            self.ln = nn.LayerNorm(n_embd)
            self.head = nn.Linear(n_embd, vocab)

        def forward(self, ids: Any) -> Any:
            positions = torch.arange(ids.shape[1], device=ids.device)
            return self.head(self.ln(self.blocks(self.tok(ids) + self.pos(positions))))

    def batch_of(source: Any, size: int) -> tuple[Any, Any]:
        starts = torch.randint(0, len(source) - block - 1, (size,), generator=generator)
        x = torch.stack([source[s : s + block] for s in starts.tolist()])
        y = torch.stack([source[s + 1 : s + 1 + block] for s in starts.tolist()])
        return x.to(device), y.to(device)

    model = GPT().to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=peak_lr, weight_decay=0.01)
    n_params = sum(p.numel() for p in model.parameters())
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else ""
    print(
        f"tiny-lm torch GPT on {device} {name}: {len(data):,} characters, vocabulary {vocab}, "
        f"block {block}, {n_layer} layers × {n_head} heads × {n_embd}, batch {batch}, "
        f"{n_params:,} parameters",
        flush=True,
    )
    first = last = float("nan")
    done = 0
    began = time.perf_counter()
    model.train()
    for step in range(args.steps):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, args.steps, peak_lr)
        x, y = batch_of(train, batch)
        loss = F.cross_entropy(model(x).view(-1, vocab), y.view(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        value = float(loss.item())
        first = value if step == 0 else first
        last = value
        done = step + 1
        print(f"step {done} loss {value:.4f}", flush=True)
        if stop.requested:
            break
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - began

    model.eval()
    with torch.no_grad():
        x, y = batch_of(val, 16)
        val_loss = float(F.cross_entropy(model(x).view(-1, vocab), y.view(-1)).item())
        ids = torch.tensor([corpus.encode(corpus.text[:block])], device=device)
        for _ in range(args.sample_chars):
            logits = model(ids[:, -block:])[:, -1, :] / 0.8
            choice = torch.multinomial(F.softmax(logits, dim=-1), 1)
            ids = torch.cat([ids, choice], dim=1)
        sample = corpus.decode(ids[0, block:].tolist())

    args.output.mkdir(parents=True, exist_ok=True)
    checkpoint = args.output / "checkpoint.pt"
    torch.save(
        {
            "model": model.state_dict(),
            "vocab": corpus.chars,
            "config": {"block": block, "n_embd": n_embd, "n_head": n_head, "n_layer": n_layer},
        },
        checkpoint,
    )
    return Result(
        backend="torch",
        device=f"cuda ({name})" if name else "cpu",
        steps=done,
        first_loss=first,
        final_loss=last,
        val_loss=val_loss,
        seconds=seconds,
        tokens=done * batch * block,
        params=n_params,
        checkpoint=checkpoint.name,
        sample=sample,
        interrupted=stop.requested,
    )


# ---- main -------------------------------------------------------------------------------------------


def choose_backend(wanted: str) -> str:
    if wanted == "auto":
        return "torch" if torch_cuda_available() else "numpy"
    return wanted


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    stop = Stop()
    backend = choose_backend(args.backend)
    if backend == "numpy":
        # Small matrices: one BLAS thread is fastest, and far faster than several threads fighting
        # over cores that other jobs share. An explicit setting in the job's env still wins.
        for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ.setdefault(name, "1")
    try:
        trainer = train_torch if backend == "torch" else train_numpy
        if backend == "numpy":
            import numpy  # noqa: F401 - fail early with a clear message
        else:
            import torch  # noqa: F401
    except ImportError:
        print(
            f"tiny-lm: the {backend} backend needs {backend} in the Python that runs this job "
            f"({sys.executable}): install it there (pip install {backend}), or run this script with a "
            "Python that has it (the job file's TINY_LM_PYTHON)",
            file=sys.stderr,
        )
        return 2
    corpus = load_corpus(args.data)
    print(
        f"tiny-lm: job {os.environ.get('SXWL_JOB_ID', '(not under sxwl)')}, attempt "
        f"{os.environ.get('SXWL_ATTEMPT', '-')}, CUDA_VISIBLE_DEVICES="
        f"{os.environ.get('CUDA_VISIBLE_DEVICES', '(unset)')}, output {args.output}",
        flush=True,
    )
    result = trainer(args, corpus, stop)
    metrics = {
        **{k: v for k, v in asdict(result).items() if k != "sample"},
        "tokens_per_s": result.tokens / result.seconds if result.seconds > 0 else 0.0,
        "seed": args.seed,
        "vocab_size": corpus.vocab_size,
        "text_chars": len(corpus.text),
        "job_id": os.environ.get("SXWL_JOB_ID"),
    }
    (args.output / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    print(
        f"done: {result.steps} steps in {result.seconds:.1f} s on {result.device} ({result.backend}), "
        f"loss {result.first_loss:.4f} -> {result.final_loss:.4f}, validation loss {result.val_loss:.4f}, "
        f"{metrics['tokens_per_s']:,.0f} tokens/s",
        flush=True,
    )
    print("sample:\n" + result.sample, flush=True)
    print(f"wrote {args.output / result.checkpoint} and {args.output / 'metrics.json'}", flush=True)
    return SIGTERM_EXIT if result.interrupted else 0


if __name__ == "__main__":
    sys.exit(main())
