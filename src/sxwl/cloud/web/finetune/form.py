"""The new fine-tune form (微调 → 新建): its fields, the body it makes for the API's own
``FineTuneRequest`` (the limits the API and the CLI share), and the model's and the service's
refusals in the console's words, per field."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any

from pydantic import ValidationError

from sxwl.cloud.db.finetune_models import CatalogModel
from sxwl.cloud.errors import AppError
from sxwl.cloud.web.finetune.view import FileRow
from sxwl.cloud.web.i18n import translate
from sxwl.protocol.finetune import MAX_BATCH_SIZE, MAX_EPOCHS, MAX_LR_MULTIPLIER, FineTuneRequest
from sxwl.protocol.jobs import MAX_GPUS_PER_NODE
from sxwl.protocol.money import money_text, parse_yuan

FORM_FIELDS = (
    "model",
    "training_file",
    "validation_file",
    "n_epochs",
    "batch_size",
    "learning_rate_multiplier",
    "suffix",
    "seed",
    "lora_rank",
    "lora_alpha",
    "gpu_product",
    "gpus",
    "max_cost_yuan",
)
FORM_DEFAULTS = {"gpus": "0", "lora_rank": "8", "lora_alpha": "16"}
MAX_COST_YUAN = Decimal(10_000_000)
_HYPER = ("n_epochs", "batch_size", "learning_rate_multiplier")
# FineTuneRequest's field (or the first parts of its location) -> the form's field.
_FORM_FIELD = {"max_cost": "max_cost_yuan", "lora.rank": "lora_rank", "lora.alpha": "lora_alpha"}


def defaults(
    models: Sequence[CatalogModel], files: Sequence[FileRow], last_model: str | None, gpus: int
) -> dict[str, str]:
    """What the form starts with, so that submitting it untouched starts a fine-tune that can run:
    the base model of the user's latest fine-tune (else the smallest, the quickest to try), their
    newest usable file, and 1 GPU only where an online CPod that runs fine-tunes has one (else 0: on
    CPUs, where a GPU asked for would keep it queued for ever)."""
    chosen = dict(FORM_DEFAULTS, gpus="1" if gpus > 0 else "0")
    if last_model is not None and any(m.name == last_model for m in models):
        chosen["model"] = last_model
    elif models:  # a model of unknown size after every known one
        chosen["model"] = min(models, key=lambda m: m.parameters or 2**63).name
    if files:
        chosen["training_file"] = files[0].id
    return chosen


def request_payload(form: Mapping[str, str]) -> dict[str, Any]:
    """The form as the JSON body the API takes: blank optional fields left out ("auto" for the
    hyperparameters, as OpenAI's body has them)."""
    value = {k: form.get(k, "").strip() for k in FORM_FIELDS}
    payload: dict[str, Any] = {"model": value["model"], "training_file": value["training_file"]}
    for name in ("validation_file", "suffix", "seed", "gpu_product"):
        if value[name]:
            payload[name] = value[name]
    payload["hyperparameters"] = {name: value[name] for name in _HYPER if value[name]}
    payload["lora"] = {k: value[f"lora_{k}"] for k in ("rank", "alpha") if value[f"lora_{k}"]}
    payload["gpus"] = value["gpus"] or "0"
    return payload


def _form_field(loc: Sequence[int | str]) -> str:
    parts = [str(p) for p in loc]
    if not parts:
        return "form"
    if parts[0] == "hyperparameters" and len(parts) > 1:
        return parts[1]
    return _FORM_FIELD.get(".".join(parts[:2]), _FORM_FIELD.get(parts[0], parts[0]))


_RANGES: dict[str, tuple[str, dict[str, object]]] = {
    "n_epochs": ("ft.error.auto_range", {"low": 1, "high": MAX_EPOCHS}),
    "batch_size": ("ft.error.auto_range", {"low": 1, "high": MAX_BATCH_SIZE}),
    "learning_rate_multiplier": ("ft.error.lr", {"high": MAX_LR_MULTIPLIER}),
    "seed": ("ft.error.range", {"low": 0, "high": 2**31 - 1}),
    "lora_rank": ("ft.error.range", {"low": 1, "high": 256}),
    "lora_alpha": ("ft.error.range", {"low": 1, "high": 1024}),
    "gpus": ("ft.error.range", {"low": 0, "high": MAX_GPUS_PER_NODE}),
}


def _message(lang: str, name: str, kind: str, raw: str) -> str:
    if name in _RANGES:
        key, values = _RANGES[name]
        return translate(lang, key, **values)
    if name == "suffix":
        return translate(lang, "ft.error.suffix")
    if name in ("model", "training_file") and kind in ("missing", "string_too_short"):
        return translate(lang, f"ft.error.{name}_required")
    if kind == "string_too_long":
        return translate(lang, "error.too_long")
    if kind in ("missing", "string_too_short"):
        return translate(lang, "error.required")
    return raw


def validate_form(lang: str, form: Mapping[str, str]) -> tuple[FineTuneRequest | None, dict[str, str]]:
    """The form through FineTuneRequest: the model, or messages per form field (nothing created)."""
    errors: dict[str, str] = {}
    payload = request_payload(form)
    cap = form.get("max_cost_yuan", "").strip()
    if cap:
        try:
            payload["max_cost"] = parse_yuan(cap, maximum=MAX_COST_YUAN, allow_zero=False)
        except ValueError:
            errors["max_cost_yuan"] = translate(lang, "ft.error.max_cost", maximum=MAX_COST_YUAN)
    try:
        request = FineTuneRequest.model_validate(payload, strict=False)
    except ValidationError as exc:
        for error in exc.errors():
            name = _form_field(error["loc"])
            errors.setdefault(name, _message(lang, name, error["type"], error["msg"]))
        return None, errors
    return (None, errors) if errors else (request, {})


def create_errors(lang: str, exc: AppError) -> dict[str, str]:
    """A refusal of the fine-tunes service (a file with errors, a cost above the cap) as form-field
    messages; the service's own words follow the console's where it knows the case."""
    errors: dict[str, str] = {}
    details = exc.details if isinstance(exc.details, list) else []
    for detail in details:
        name = _FORM_FIELD.get(str(detail.get("field", "")), str(detail.get("field", "form")))
        message = str(detail.get("message", exc.message))
        if name == "max_cost_yuan" and "cost" in detail:
            cost, cap = money_text(int(detail["cost"])), money_text(int(detail["cap"]))
            message = translate(lang, "ft.error.over_cap", cost=cost, steps=detail["steps"], cap=cap)
        elif name == "max_cost_yuan" and detail.get("code") == "no_price":
            message = translate(lang, "ft.error.no_price")
        errors.setdefault(name, message)
    return errors or {"form": exc.message}
