"""``sxwl endpoints`` and ``sxwl keys``: deploy a model as an OpenAI-compatible endpoint, follow it,
delete it, and the inference keys that call it (docs/endpoints.md)."""

from __future__ import annotations

import sys
from typing import Annotated, Any

import typer
from rich.markup import escape

from sxwl.cli import client, ids
from sxwl.cli.client import CliError
from sxwl.cli.output import listing, out, show, status_text
from sxwl.protocol.endpoints import MAX_KEY_RPM, MAX_KEY_TPM, MAX_REPLICAS
from sxwl.protocol.jobs import MAX_GPUS_PER_NODE

app = typer.Typer(help="Inference endpoints: deploy a model, list, show, logs, delete.", no_args_is_help=True)
keys_app = typer.Typer(help="Inference keys (sk-…) that call your endpoints.", no_args_is_help=True)
PATH = "/api/v1/endpoints"
EndpointId = Annotated[str, typer.Argument(help="Endpoint id (ep-…), a unique prefix, or its name.")]


def endpoint(given: str) -> dict[str, Any]:
    """An endpoint of the caller's by id, unique prefix, or name."""
    found: list[dict[str, Any]] = client.call("GET", PATH).json()
    named = [e for e in found if e["name"] == given]
    if named:
        return named[0]

    def get(found_id: str) -> dict[str, Any]:
        body: dict[str, Any] = client.call("GET", f"{PATH}/{found_id}").json()
        return body

    listed = [str(e["id"]) for e in found]
    return ids.fetch(given, get, lambda: listed, noun="endpoint", listing="sxwl endpoints list")


def _load(load: dict[str, Any] | None) -> str:
    """A serving replica's engine load: its own metrics, or the requests the agent forwards now."""
    if not load:
        return ""
    waiting = "" if load["waiting"] is None else f", {load['waiting']} waiting"
    said = "engine metrics" if load["source"] == "engine" else "counted by the agent"
    return f"; load {load['running']} running{waiting} ({said}, {load['at']})"


def _print(e: dict[str, Any]) -> None:
    reason = f" ({escape(e['reason'])})" if e.get("reason") else ""
    out.print(f"[bold]{escape(e['name'])}[/] {e['id']}: {status_text(e['state'])}{reason}", soft_wrap=True)
    gpus = f"{e['gpus']} × {e['gpu_product'] or 'GPU'}" if e["gpus"] else "CPU"
    out.print(f"model {escape(e['model'])}, {gpus} per replica, {e['replicas_ready']}/{e['replicas']} ready")
    out.print(f"call it: base_url={e['url']} model={escape(e['name'])}", soft_wrap=True)
    for r in e["replica_jobs"]:
        where = f" on {r['cpod_id']}" if r["cpod_id"] else ""
        state = f"{status_text(r['state'])}, attempt {r['attempt']}{where}"
        out.print(f"  replica {r['replica']}: job {r['job_id']} {state}{_load(r.get('load'))}")
    for day in e.get("usage", []):
        who = day["key_id"] or "your token"
        tokens = f"{day['prompt_tokens']} + {day['completion_tokens']} tokens"
        out.print(f"  {day['day']} {who}: {day['requests']} requests, {tokens}")


@app.command("create")
def create(
    model: Annotated[str, typer.Option(help="A catalogue model, or a fine-tuned one (ft:…).")],
    name: Annotated[str | None, typer.Option(help="What to call it (default: the model's name).")] = None,
    gpus: Annotated[int, typer.Option(min=0, max=MAX_GPUS_PER_NODE, help="GPUs per replica; 0: CPU.")] = 1,
    gpu_product: Annotated[str | None, typer.Option(help="A GPU product an online CPod offers.")] = None,
    replicas: Annotated[int, typer.Option(min=1, max=MAX_REPLICAS)] = 1,
    max_model_len: Annotated[int | None, typer.Option(help="The engine's context length.")] = None,
) -> None:
    """Deploy an endpoint; it is ready once every replica's engine answers (`sxwl endpoints show`)."""
    chosen = name or model.replace(":", "-")[:63]
    body: dict[str, Any] = {"name": chosen, "model": model, "gpus": gpus, "replicas": replicas}
    if gpu_product:
        body["gpu_product"] = gpu_product
    if max_model_len is not None:
        body["max_model_len"] = max_model_len
    try:
        created = client.call("POST", PATH, json=body).json()
    except client.ApiError as exc:
        raise CliError(str(exc)) from None
    _print(created)


@app.command("list")
def list_endpoints(
    stopped: Annotated[bool, typer.Option(help="Deleted endpoints too.")] = False,
) -> None:
    """Your endpoints, newest first."""
    found = client.call("GET", PATH, params={"stopped": stopped}).json()
    if not found:
        out.print("No endpoints. Deploy one with `sxwl endpoints create --model MODEL`.")
        return
    table = listing("id", "name", "state", "model", "replicas")
    for e in found:
        ready = f"{e['replicas_ready']}/{e['replicas']}"
        table.add_row(e["id"], escape(e["name"]), status_text(e["state"]), escape(e["model"]), ready)
    show(table)


@app.command("show")
def show_endpoint(endpoint_id: EndpointId) -> None:
    """An endpoint's state, replicas, URL and usage per day."""
    _print(endpoint(endpoint_id))


@app.command("logs")
def logs(
    endpoint_id: EndpointId,
    replica: Annotated[int, typer.Option(min=1, max=MAX_REPLICAS, help="Which replica.")] = 1,
) -> None:
    """The engine's output of one replica (its job's log)."""
    found = endpoint(endpoint_id)
    jobs = [r for r in found["replica_jobs"] if r["replica"] == replica]
    if not jobs:
        raise CliError(f"endpoint {found['name']} has replicas 1 to {found['replicas']}", exit_code=2)
    offset = 0
    while True:
        response = client.call("GET", f"/api/v1/jobs/{jobs[-1]['job_id']}/logs", params={"offset": offset})
        sys.stdout.buffer.write(response.content)
        next_offset = int(response.headers["X-Next-Offset"])
        if not response.content or next_offset == offset:
            sys.stdout.flush()
            return
        offset = next_offset


@app.command("delete")
def delete(endpoint_id: EndpointId) -> None:
    """Stop every replica and free the name."""
    found = endpoint(endpoint_id)
    stopped = client.call("DELETE", f"{PATH}/{found['id']}").json()
    out.print(f"endpoint {stopped['name']} {stopped['id']}: {status_text(stopped['state'])}")


Rpm = Annotated[
    int | None,
    typer.Option(min=1, max=MAX_KEY_RPM, help="Requests per minute, across the cloud's replicas."),
]
Tpm = Annotated[
    int | None,
    typer.Option(
        min=1,
        max=MAX_KEY_TPM,
        help="Tokens (prompt + completion) per minute, across replicas.",
    ),
]
MonthlyCap = Annotated[
    str | None,
    typer.Option(
        "--monthly-cap",
        help="Spend per UTC calendar month in yuan, e.g. 50 or 12.5: its share of its endpoints' cost.",
    ),
]


def _limits(rpm: int | None, tpm: int | None, monthly_cap: str | None) -> dict[str, Any]:
    given = {"rpm": rpm, "tpm": tpm, "monthly_cap": monthly_cap}
    return {k: v for k, v in given.items() if v is not None}


def _limits_text(key: dict[str, Any]) -> tuple[str, str, str]:
    cap = key["monthly_cap_yuan"]
    return str(key["rpm"] or ""), str(key["tpm"] or ""), "" if cap is None else f"¥{cap}"


@keys_app.command("create")
def create_key(
    name: Annotated[str, typer.Option(help="What the key is for.")] = "key",
    rpm: Rpm = None,
    tpm: Tpm = None,
    monthly_cap: MonthlyCap = None,
) -> None:
    """A new key: its secret is printed once, keep it (it is stored hashed)."""
    body: dict[str, Any] = {"name": name} | _limits(rpm, tpm, monthly_cap)
    try:
        made = client.call("POST", "/api/v1/keys", json=body).json()
    except client.ApiError as exc:
        raise CliError(str(exc)) from None
    out.print(f"key {made['id']} ({escape(made['name'])}); shown this once:", soft_wrap=True)
    sys.stdout.write(made["key"] + "\n")


@keys_app.command("limits")
def change_limits(
    key_id: Annotated[str, typer.Argument(help="Key id (key-…).")],
    rpm: Rpm = None,
    tpm: Tpm = None,
    monthly_cap: MonthlyCap = None,
    lift: Annotated[
        list[str] | None,
        typer.Option(help="A limit to remove: rpm, tpm or monthly_cap (repeat for several)."),
    ] = None,
) -> None:
    """Change a key's limits: the ones given are set, the lifted ones removed, the rest kept."""
    body = _limits(rpm, tpm, monthly_cap)
    for limit in lift or []:
        if limit not in ("rpm", "tpm", "monthly_cap"):
            raise CliError(f"--lift {limit}: must be rpm, tpm or monthly_cap")
        if limit in body:
            raise CliError(f"--lift {limit}: that limit is also given a value")
        body[limit] = None
    if not body:
        raise CliError("give a limit to set (--rpm, --tpm, --monthly-cap) or one to --lift")
    try:
        key = client.call("PATCH", f"/api/v1/keys/{key_id}", json=body).json()
    except client.ApiError as exc:
        raise CliError(str(exc)) from None
    rpm_text, tpm_text, cap_text = _limits_text(key)
    out.print(f"key {key['id']}: rpm {rpm_text or '-'}, tpm {tpm_text or '-'}, monthly cap {cap_text or '-'}")


@keys_app.command("list")
def list_keys() -> None:
    """Your keys (never their secrets), their limits and what each spent this month."""
    found = client.call("GET", "/api/v1/keys").json()
    table = listing("id", "name", "prefix", "rpm", "tpm", "monthly cap", "spent", "state")
    for k in found:
        state = "revoked" if k["revoked_at"] else "active"
        spent = f"¥{k['spent_this_month_yuan']}"
        table.add_row(k["id"], escape(k["name"]), k["prefix"] + "…", *_limits_text(k), spent, state)
    show(table)


@keys_app.command("revoke")
def revoke(key_id: Annotated[str, typer.Argument(help="Key id (key-…).")]) -> None:
    """Revoke a key: its next request is refused."""
    try:
        revoked = client.call("DELETE", f"/api/v1/keys/{key_id}").json()
    except client.ApiError as exc:
        raise CliError(str(exc)) from None
    out.print(f"key {revoked['id']} revoked")
