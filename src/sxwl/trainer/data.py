"""The training data: JSONL in chat format (``{"messages": [...]}``) or prompt/completion, turned
into token ids with labels on the assistant's (or the completion's) tokens only."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from transformers import PreTrainedTokenizerBase

from sxwl.protocol import jsonl
from sxwl.protocol.finetune import DatasetCount, DatasetRole
from sxwl.trainer import TrainerError

IGNORE = -100  # the label the loss skips
ROLES = ("system", "user", "assistant")


@dataclass(frozen=True)
class Segment:
    text: str
    trained: bool


@dataclass(frozen=True)
class Example:
    input_ids: list[int]
    labels: list[int]


Message = dict[str, str]


def _fail(where: str, line: int, why: str) -> TrainerError:
    return TrainerError(f"{where} line {line}: {why}")


def _messages(value: object, where: str, line: int) -> list[Message]:
    if not isinstance(value, list) or not value:
        raise _fail(where, line, '"messages" must be a non-empty list')
    out: list[Message] = []
    for i, m in enumerate(value):
        if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
            raise _fail(
                where, line, f'messages[{i}] must be {{"role": system|user|assistant, "content": str}}'
            )
        out.append({"role": m["role"], "content": m["content"]})
    if not any(m["role"] == "assistant" for m in out):
        raise _fail(where, line, "no assistant message to learn from")
    return out


def read_records(path: Path, *, where: str) -> list[list[Message] | tuple[str, str]]:
    """Each non-blank line: a conversation, or a (prompt, completion) pair. Lines are cut as the
    cloud's check cut them (sxwl/protocol/jsonl.py), so a file it accepted reads the same here."""
    try:
        lines = jsonl.split_lines(path.read_bytes())
    except OSError as e:
        raise TrainerError(f"{where}: cannot read {path}: {e}") from e
    records: list[list[Message] | tuple[str, str]] = []
    for number, raw in enumerate(lines, start=1):
        if jsonl.blank(raw):
            continue
        try:
            obj = jsonl.parse(raw)
        except UnicodeDecodeError as e:
            raise _fail(where, number, f"not UTF-8 ({e})") from e
        except (ValueError, RecursionError) as e:
            raise _fail(where, number, f"not JSON ({e})") from e
        if not isinstance(obj, dict):
            raise _fail(where, number, "not a JSON object")
        if "messages" in obj:
            records.append(_messages(obj["messages"], where, number))
        elif isinstance(obj.get("prompt"), str) and isinstance(obj.get("completion"), str):
            records.append((obj["prompt"], obj["completion"]))
        else:
            raise _fail(where, number, 'needs "messages", or "prompt" and "completion" strings')
    if not records:
        raise TrainerError(f"{where}: {path} has no examples")
    return records


def simple_format(messages: list[Message], eos: str) -> list[Segment]:
    """The format for a tokenizer without a chat template: each message as ``<|role|>\\n`` and its
    content on its own lines; an assistant's content ends with the EOS token so the model learns to
    stop."""
    segments: list[Segment] = []
    for m in messages:
        segments.append(Segment(f"<|{m['role']}|>\n", trained=False))
        if m["role"] == "assistant":
            segments.append(Segment(m["content"] + eos, trained=True))
            segments.append(Segment("\n", trained=False))
        else:
            segments.append(Segment(m["content"] + "\n", trained=False))
    return segments


def _render(tokenizer: PreTrainedTokenizerBase, messages: list[Message], *, prompt: bool) -> str:
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=prompt)
    if not isinstance(text, str):
        raise TrainerError("the tokenizer's chat template did not render text")
    return text


def template_format(tokenizer: PreTrainedTokenizerBase, messages: list[Message]) -> list[Segment] | None:
    """Segments from the tokenizer's chat template: what the template adds up to and including
    each assistant's generation prompt is context, the rest of the assistant's turn is trained.
    None when the template renders a conversation's beginning differently from its whole."""
    segments: list[Segment] = []
    done = ""
    for k, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        prefix = _render(tokenizer, messages[:k], prompt=True) if k else ""
        full = _render(tokenizer, messages[: k + 1], prompt=False)
        if not prefix.startswith(done) or not full.startswith(prefix):
            return None
        segments.append(Segment(prefix[len(done) :], trained=False))
        segments.append(Segment(full[len(prefix) :], trained=True))
        done = full
    return segments


def segments_of(tokenizer: PreTrainedTokenizerBase, record: list[Message] | tuple[str, str]) -> list[Segment]:
    eos = tokenizer.eos_token or ""
    if isinstance(record, tuple):
        prompt, completion = record
        return [Segment((tokenizer.bos_token or "") + prompt, False), Segment(completion + eos, True)]
    if getattr(tokenizer, "chat_template", None):
        segments = template_format(tokenizer, record)
        if segments is not None:
            return segments
    return [Segment(tokenizer.bos_token or "", False), *simple_format(record, eos)]


def tokenize(
    tokenizer: PreTrainedTokenizerBase, record: list[Message] | tuple[str, str], max_seq_len: int
) -> Example:
    ids: list[int] = []
    labels: list[int] = []
    for segment in segments_of(tokenizer, record):
        if not segment.text:
            continue
        part = tokenizer.encode(segment.text, add_special_tokens=False)
        ids.extend(part)
        labels.extend(part if segment.trained else [IGNORE] * len(part))
    return Example(ids[:max_seq_len], labels[:max_seq_len])


@dataclass(frozen=True)
class Loaded:
    examples: list[Example]
    dropped: int  # examples without a trained token within max_seq_len

    def count(self, file: DatasetRole) -> DatasetCount:
        return DatasetCount(
            file=file,
            examples=len(self.examples),
            tokens=sum(len(e.input_ids) for e in self.examples),
            loss_tokens=sum(sum(1 for label in e.labels if label != IGNORE) for e in self.examples),
            dropped=self.dropped,
        )


def load_examples(
    tokenizer: PreTrainedTokenizerBase, path: Path, *, where: DatasetRole, max_seq_len: int
) -> Loaded:
    """The examples with at least one trained token within ``max_seq_len``."""
    examples = [tokenize(tokenizer, r, max_seq_len) for r in read_records(path, where=where)]
    kept = [e for e in examples if any(label != IGNORE for label in e.labels)]
    if not kept:
        raise TrainerError(f"{where}: no example has an assistant token within max_seq_len={max_seq_len}")
    return Loaded(kept, len(examples) - len(kept))
