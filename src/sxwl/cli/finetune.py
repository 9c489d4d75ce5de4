"""``sxwl files``, ``sxwl models`` and ``sxwl finetune``: datasets, the model catalogue and LoRA
fine-tunes through the cloud's OpenAI-compatible API (docs/finetune.md)."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import IO, Annotated, Any

import typer
from rich.markup import escape
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

from sxwl.cli import client, ids
from sxwl.cli.client import ENDED_BADLY, CliError, Credentials
from sxwl.cli.output import listing, out, show, status_text
from sxwl.protocol.finetune import MAX_BATCH_SIZE, MAX_EPOCHS, MAX_LR_MULTIPLIER
from sxwl.protocol.jobs import MAX_GPUS_PER_NODE
from sxwl.protocol.money import money_text, parse_yuan

files_app = typer.Typer(
    help="Training and validation files (JSONL): upload, check, list.", no_args_is_help=True
)
models_app = typer.Typer(
    help="The model catalogue: base models and your fine-tuned adapters.", no_args_is_help=True
)
app = typer.Typer(
    help="LoRA fine-tunes: create, follow (loss, ETA, cost), cancel, download.", no_args_is_help=True
)
TERMINAL = {"succeeded", "failed", "cancelled"}
MAX_COST_YUAN = Decimal(10_000_000)


def _when(unix: int | None) -> str:
    return "" if unix is None else datetime.fromtimestamp(unix, UTC).strftime("%Y-%m-%d %H:%M:%S")


class _Counting:
    """A file handed to httpx's multipart body that moves a progress bar as it is read."""

    def __init__(self, handle: IO[bytes], advance: Callable[[int], object]) -> None:
        self.handle = handle
        self.advance = advance

    def read(self, size: int = -1) -> bytes:
        chunk = self.handle.read(size)
        self.advance(len(chunk))
        return chunk


def _bar() -> Progress:
    columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn())
    return Progress(*columns, console=out, transient=True)


@files_app.command("upload")
def upload_file(
    path: Annotated[Path, typer.Argument(exists=True, dir_okay=False, help="A JSONL file.")],
    purpose: Annotated[str, typer.Option(help="What the file is for.")] = "fine-tune",
) -> None:
    """Upload a dataset; the cloud checks every line and says which ones are wrong."""
    with path.open("rb") as handle, _bar() as progress:
        task = progress.add_task(path.name, total=path.stat().st_size)
        reader = _Counting(handle, lambda n: progress.advance(task, n))
        try:
            file = client.call(
                "POST", "/v1/files", files={"file": (path.name, reader)}, data={"purpose": purpose}
            )
        except client.ApiError as exc:
            raise CliError(f"{path}: {exc}") from None
    uploaded = file.json()
    _print_file(uploaded)
    if uploaded["status"] != "processed":
        raise CliError(f"{path}: fix the lines above and upload it again", exit_code=ENDED_BADLY)


def _print_file(file: dict[str, Any]) -> None:
    check = file.get("validation") or {}
    name = escape(file["filename"])
    out.print(f"[bold]{file['id']}[/] {name}: {status_text(file['status'])}", soft_wrap=True)
    if check.get("format"):
        out.print(
            f"  format {check['format']}, {check.get('examples', 0):,} examples, {file['bytes']:,} bytes"
        )
    problems = check.get("problems") or []
    for problem in problems:
        out.print(f"  line {problem['line']}: {escape(problem['message'])}")
    more = int(check.get("problem_count") or 0) - len(problems)
    if more > 0:
        out.print(f"  … and {more} more problems")


@files_app.command("list")
def list_files() -> None:
    """Your files, newest first."""
    items = client.call("GET", "/v1/files", params={"limit": 100}).json()["data"]
    if not items:
        out.print("No files yet. Upload a dataset with `sxwl files upload train.jsonl`.")
        return
    table = listing("id", "filename", "status", "examples", "bytes", "created")
    for f in items:
        examples = (f.get("validation") or {}).get("examples")
        table.add_row(
            f["id"],
            escape(f["filename"]),
            status_text(f["status"]),
            str(examples or ""),
            f"{f['bytes']:,}",
            _when(f["created_at"]),
        )
    show(table)


@files_app.command("show")
def show_file(file_id: Annotated[str, typer.Argument(help="File id (file-…) or a unique prefix.")]) -> None:
    """A file's status and the problems found in it, line by line."""
    _print_file(ids.data_file(file_id))


@files_app.command("delete")
def delete_file(file_id: Annotated[str, typer.Argument(help="File id (file-…) or a unique prefix.")]) -> None:
    """Delete a file no fine-tune uses."""
    found = ids.data_file(file_id)["id"]
    try:
        client.call("DELETE", f"/v1/files/{found}")
    except client.ApiError as exc:
        raise CliError(str(exc)) from None
    out.print(f"deleted {found}")


@models_app.command("list")
def list_models() -> None:
    """Base models you can fine-tune, and your adapters."""
    items = client.call("GET", "/v1/models").json()["data"]
    if not items:
        out.print("No models yet. An admin registers base models with `sxwl admin register-model`.")
        return
    me = client.call("GET", "/api/v1/me").json()["id"]
    # The API's owner is "system" or a user id: people read whose it is.
    owners = {"system": "public", me: "you"}
    table = listing("id", "kind", "base", "architecture", "parameters", "owner")
    for m in items:
        params = m.get("parameters")
        table.add_row(
            m["id"],
            m.get("kind", ""),
            m.get("base_model") or "",
            m.get("architecture") or "",
            f"{params:,}" if params else "",
            owners.get(m.get("owned_by", ""), m.get("owned_by", "")),
        )
    show(table)


@app.command("create")
def create(
    model: Annotated[str, typer.Option("--model", help="A base model of `sxwl models list`.")],
    training_file: Annotated[
        str, typer.Option("--training-file", help="A processed file's id (file-…) or a unique prefix.")
    ],
    validation_file: Annotated[
        str | None, typer.Option("--validation-file", help="Optional; a file's id or a unique prefix.")
    ] = None,
    epochs: Annotated[
        int | None, typer.Option("--epochs", min=1, max=MAX_EPOCHS, help="Passes over the data (default 3).")
    ] = None,
    batch_size: Annotated[
        int | None,
        typer.Option("--batch-size", min=1, max=MAX_BATCH_SIZE, help="Examples per step (default 4)."),
    ] = None,
    lr_multiplier: Annotated[
        float | None,
        typer.Option("--lr-multiplier", min=0.01, max=MAX_LR_MULTIPLIER, help="× 2e-4 (default 1)."),
    ] = None,
    suffix: Annotated[str | None, typer.Option("--suffix", help="Part of the adapter's name.")] = None,
    seed: Annotated[int | None, typer.Option("--seed", min=0)] = None,
    lora_rank: Annotated[int | None, typer.Option("--lora-rank", min=1, max=256)] = None,
    lora_alpha: Annotated[int | None, typer.Option("--lora-alpha", min=1, max=1024)] = None,
    gpus: Annotated[int, typer.Option("--gpus", min=0, max=MAX_GPUS_PER_NODE, help="0: on CPUs.")] = 0,
    gpu_product: Annotated[str | None, typer.Option("--gpu-product", help="e.g. NVIDIA-H200.")] = None,
    max_cost: Annotated[
        str | None, typer.Option("--max-cost", help="CNY; refused if it would cost more.")
    ] = None,
) -> None:
    """Start a fine-tune: `sxwl finetune create --model tiny-llama --training-file file-…`."""
    hyper = {"n_epochs": epochs, "batch_size": batch_size, "learning_rate_multiplier": lr_multiplier}
    lora = {"rank": lora_rank, "alpha": lora_alpha}
    body: dict[str, Any] = {
        "model": model,
        "training_file": _file_flag("--training-file", training_file),
        "validation_file": validation_file and _file_flag("--validation-file", validation_file),
        "suffix": suffix,
        "seed": seed,
        "gpus": gpus,
        "gpu_product": gpu_product,
        "hyperparameters": {k: v for k, v in hyper.items() if v is not None},
        "lora": {k: v for k, v in lora.items() if v is not None},
    }
    if max_cost is not None:
        try:
            body["max_cost"] = parse_yuan(max_cost, maximum=MAX_COST_YUAN, allow_zero=True)
        except ValueError as exc:
            raise CliError(f"--max-cost {max_cost!r}: {exc}", exit_code=2) from None
    try:
        job = client.call(
            "POST", "/v1/fine_tuning/jobs", json={k: v for k, v in body.items() if v is not None}
        )
    except client.ApiError as exc:
        raise CliError(_explain(exc), exit_code=2 if exc.status == 422 else 1) from None
    created = job.json()
    out.print(f"created fine-tune [bold]{created['id']}[/]: {status_text(created['status'])}")
    out.print(f"follow it with: sxwl finetune show {created['id']} -f")


def _file_flag(flag: str, given: str) -> str:
    try:
        return str(ids.data_file(given)["id"])
    except CliError as exc:
        raise CliError(f"{flag}: {exc}", exit_code=exc.exit_code) from None


_FLAGS = {"hyperparameters.n_epochs": "--epochs", "hyperparameters.batch_size": "--batch-size"}


def _explain(exc: client.ApiError) -> str:
    if not isinstance(exc.details, list):
        return str(exc)
    parts = []
    for detail in exc.details:
        field = str(detail.get("field", ""))
        flag = _FLAGS.get(field, "--" + field.split(".")[-1].replace("_", "-"))
        parts.append(f"{flag}: {detail.get('message')}")
    return "invalid fine-tune: " + "; ".join(parts)


@app.command("list")
def list_fine_tunes(
    all_users: Annotated[
        bool, typer.Option("--all", help="Admins: every user's fine-tunes, with their owner's id.")
    ] = False,
) -> None:
    """Your fine-tunes, newest first."""
    params = {"limit": 100, "all": all_users}
    items = client.call("GET", "/v1/fine_tuning/jobs", params=params).json()["data"]
    if not items:
        out.print("No fine-tunes yet. Start one with `sxwl finetune create --model M --training-file F`.")
        return
    table = listing(
        "id", *(["owner"] if all_users else []), "model", "status", "progress", "fine-tuned model", "created",
        ids=("id", "owner", "fine-tuned model"),
    )  # fmt: skip
    for j in items:
        table.add_row(
            j["id"],
            *([j["organization_id"]] if all_users else []),
            j["model"],
            status_text(j["status"]),
            _progress(j),
            j["fine_tuned_model"] or "",
            _when(j["created_at"]),
        )
    show(table)


def _progress(job: dict[str, Any]) -> str:
    progress = job.get("progress") or {}
    if not progress.get("total_steps"):
        return ""
    return f"{progress['step']}/{progress['total_steps']} ({progress.get('percent') or 0:.0f}%)"


def _summary(job: dict[str, Any]) -> str:
    parts = [f"{job['id']}: {status_text(job['status'])}", _progress(job)]
    if job.get("estimated_finish") and job["status"] == "running":
        parts.append(f"ETA {_when(job['estimated_finish'])} UTC")
    parts.append(_cost(job))
    if job.get("reason"):  # what a queued one waits for, or why it failed or was cancelled
        parts.append(f"{'waiting' if job['status'] == 'queued' else 'reason'}: {escape(job['reason'])}")
    return "  ".join(p for p in parts if p)


def _cost(job: dict[str, Any]) -> str:
    cost = job.get("cost") or {}
    if cost.get("so_far") is None:
        return ""
    if job["status"] in TERMINAL:
        return f"cost {money_text(cost['so_far'])} CNY"
    expected = cost.get("expected_total")
    guess = f", expected ~{money_text(expected)} CNY" if expected else ""
    return f"cost so far {money_text(cost['so_far'])} CNY{guess}"


@app.command("show")
def show_fine_tune(
    fine_tune_id: Annotated[str, typer.Argument(help="Fine-tune id (ftjob-…) or a unique prefix.")],
    follow: Annotated[
        bool, typer.Option("-f", "--follow", help="Print new events until it ends (exit 3 if it fails).")
    ] = False,
) -> None:
    """A fine-tune's status, progress, ETA and cost, and its events (loss, checkpoints)."""
    job = ids.fine_tune(fine_tune_id)
    path = f"/v1/fine_tuning/jobs/{job['id']}"
    seen: set[str] = set()
    while True:
        events = client.call("GET", f"{path}/events", params={"limit": 100}).json()
        for event in reversed(events["data"]):
            if event["id"] not in seen:
                seen.add(event["id"])
                out.print(f"[dim]{_when(event['created_at'])}[/] {escape(event['message'])}")
        out.print(_summary(job), soft_wrap=True)
        if not follow or job["status"] in TERMINAL:
            if job.get("fine_tuned_model"):
                out.print(
                    f"adapter: [bold]{job['fine_tuned_model']}[/] (sxwl finetune download {job['id']})",
                    soft_wrap=True,
                )
            if follow and job["status"] != "succeeded":
                raise typer.Exit(ENDED_BADLY)
            return
        time.sleep(2.0)
        job = client.call("GET", path).json()


@app.command("checkpoints")
def checkpoints(
    fine_tune_id: Annotated[str, typer.Argument(help="Fine-tune id (ftjob-…) or a unique prefix.")],
) -> None:
    """The checkpoints that reached the cloud (a lost CPod's successor resumes from the last)."""
    found = ids.fine_tune(fine_tune_id)["id"]
    items = client.call("GET", f"/v1/fine_tuning/jobs/{found}/checkpoints").json()["data"]
    if not items:
        out.print("No checkpoints yet: the trainer saves one at the end of each epoch.")
        return
    table = listing("id", "step", "metrics", "created")
    for c in items:
        metrics = ", ".join(
            f"{k} {v:.4g}" for k, v in (c.get("metrics") or {}).items() if isinstance(v, float)
        )
        table.add_row(c["id"], str(c["step_number"]), metrics, _when(c["created_at"]))
    show(table)


@app.command("cancel")
def cancel(
    fine_tune_id: Annotated[str, typer.Argument(help="Fine-tune id (ftjob-…) or a unique prefix.")],
) -> None:
    """Cancel a fine-tune (its job gets SIGTERM, then SIGKILL)."""
    found = ids.fine_tune(fine_tune_id)["id"]
    try:
        job = client.call("POST", f"/v1/fine_tuning/jobs/{found}/cancel").json()
    except client.ApiError as exc:
        raise CliError(str(exc)) from None
    out.print(f"fine-tune {job['id']}: {status_text(job['status'])}")


@app.command("download")
def download(
    fine_tune_id: Annotated[str, typer.Argument(help="Fine-tune id (ftjob-…) or a unique prefix.")],
    output: Annotated[Path, typer.Option("-o", "--output", help="Where to save the adapter's tar.")] = Path(
        "."
    ),
) -> None:
    """Save the adapter a finished fine-tune produced (a tar: untar it, load it with peft)."""
    job = ids.fine_tune(fine_tune_id)
    model = job.get("fine_tuned_model")
    if not model:
        raise CliError(f"{job['id']} has no adapter yet (status {job['status']})")
    target = output / (model.replace(":", "_") + ".tar") if output.is_dir() else output
    info = client.call("GET", f"/v1/models/{model}").json()
    with _bar() as progress:
        task = progress.add_task(model, total=info.get("bytes"))
        client.download(
            Credentials.load(), f"/api/v1/models/{model}/content", target, lambda n: progress.advance(task, n)
        )
    out.print(f"saved {target}: `tar xf {target.name}` then PeftModel.from_pretrained(base, <dir>)")
