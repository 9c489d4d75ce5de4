"""Day-2 commands: ``3kctl status``, ``3kctl add nodes`` and ``3kctl delete node``."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, TextIO

from rich.console import Console
from rich.table import Table

from sxwl.ctl import kubekey
from sxwl.ctl.cloud import KeyCheck, check_access_key
from sxwl.ctl.deploy import AGENT_NAMESPACE, failures_text, kk_command, preflight_table, preflight_text
from sxwl.ctl.errors import CtlError, UsageError
from sxwl.ctl.preflight import Report, run_preflight
from sxwl.ctl.runner import Command
from sxwl.ctl.ssh import run_sync
from sxwl.ctl.steps import Context, Ledger, Step, StepFailed

DEPLOY = "deploy all"


def deployed_hosts(ctx: Context) -> list[str]:
    hosts: list[str] = Ledger(ctx.work.ledger).section(DEPLOY).get("hosts", [])
    return hosts


def require_cluster(ctx: Context) -> None:
    if not ctx.work.kubeconfig.exists():
        raise CtlError(
            f"no cluster yet: {ctx.work.kubeconfig} is missing; run `3kctl deploy all --access-key=…` first "
            f"(or pass the --work-dir it used)"
        )


# --- status -----------------------------------------------------------------------------------------


@dataclass
class Status:
    ok: bool = True
    lines: list[str] = field(default_factory=list)


def status(ctx: Context, console: Console, access_key: str | None) -> bool:
    ledger = Ledger(ctx.work.ledger).section(DEPLOY)
    steps = ledger.get("steps", {})
    healthy = True
    if steps:
        done = [n for n, s in steps.items() if s.get("status") == "done"]
        other = [f"{n} ({s.get('status')})" for n, s in steps.items() if s.get("status") != "done"]
        console.print(
            f"[bold]deploy all[/]: {len(done)} steps done"
            + (f"; not done: {', '.join(other)}" if other else "")
        )
        healthy = not other
    else:
        console.print("[bold]deploy all[/]: never run from this work dir")
    if not ctx.work.kubeconfig.exists():
        console.print(f"[yellow]no kubeconfig in {ctx.work.root}: the cluster is not deployed yet[/]")
        return False
    with ctx.work.log("status").open("a") as log:
        healthy &= _nodes(ctx, console, log)
        healthy &= _releases(ctx, console, log)
        healthy &= _agent(ctx, console, log)
    if access_key:
        check = check_access_key(ctx.cloud, access_key)
        healthy &= _cloud(ctx, console, check)
    else:
        console.print("cloud: pass --access-key (or SXWL_ACCESS_KEY) to see the CPod as 算想云 sees it")
    return healthy


def _json(ctx: Context, log: TextIO, command: Command) -> Any:
    outcome = ctx.tools.kube.run(command, log)
    if not outcome.ok:
        return None
    try:
        return json.loads(outcome.stdout or "null")
    except ValueError:
        return None


def _nodes(ctx: Context, console: Console, log: TextIO) -> bool:
    data = _json(ctx, log, ctx.kubectl("get", "nodes", "-o", "json"))
    if data is None:
        console.print("[red]✗[/] nodes: the API server does not answer (`kubectl get nodes` failed)")
        return False
    table = Table("node", "ready", "roles", "kubelet", "GPUs", title="nodes")
    healthy = True
    seen = set()
    for item in data.get("items", []):
        meta, node_status = item.get("metadata", {}), item.get("status", {})
        name = meta.get("name", "?")
        seen.add(name)
        ready = any(
            c.get("type") == "Ready" and c.get("status") == "True" for c in node_status.get("conditions", [])
        )
        healthy &= ready
        labels = meta.get("labels", {})
        roles = sorted(k.split("/", 1)[1] for k in labels if k.startswith("node-role.kubernetes.io/"))
        gpus = node_status.get("capacity", {}).get("nvidia.com/gpu", "0")
        product = labels.get("nvidia.com/gpu.product", "")
        table.add_row(
            name,
            "[green]✓[/]" if ready else "[red]✗[/]",
            ",".join(roles) or "-",
            node_status.get("nodeInfo", {}).get("kubeletVersion", "?"),
            f"{gpus} {product}".strip(),
        )
    console.print(table)
    missing = [h for h in deployed_hosts(ctx) if h not in seen]
    if missing:
        console.print(f"[red]✗[/] deployed but not in the cluster: {', '.join(missing)}")
        healthy = False
    return healthy


def _releases(ctx: Context, console: Console, log: TextIO) -> bool:
    data = _json(
        ctx,
        log,
        Command([ctx.tools.helm, "list", "-A", "-o", "json", "--kubeconfig", str(ctx.work.kubeconfig)]),
    )
    # By name and namespace: a release name is unique only within its namespace.
    releases = {(r.get("name"), r.get("namespace")): r for r in data or []}
    expected = [c for c in ctx.manifest.charts] if ctx.artifact_root else []
    expected += (
        [c for c in ctx.manifest.ceph if (c.release, c.namespace) in releases] if ctx.artifact_root else []
    )
    table = Table("component", "namespace", "chart", "status", title="platform components")
    healthy = True
    for chart in expected:
        release = releases.get((chart.release, chart.namespace))
        state = release.get("status", "?") if release else "not installed"
        healthy &= state == "deployed"
        mark = "[green]✓[/]" if state == "deployed" else "[red]✗[/]"
        table.add_row(
            chart.release, chart.namespace, release.get("chart", "") if release else "", f"{mark} {state}"
        )
    for (name, namespace), release in releases.items():
        if (name, namespace) not in {(c.release, c.namespace) for c in expected}:
            table.add_row(
                str(name), str(namespace or ""), release.get("chart", ""), release.get("status", "")
            )
    console.print(table)
    return healthy


def _agent(ctx: Context, console: Console, log: TextIO) -> bool:
    data = _json(
        ctx, log, ctx.kubectl("-n", AGENT_NAMESPACE, "get", "deployment", "sxwl-agent", "-o", "json")
    )
    if not data:
        console.print(f"[red]✗[/] agent: no deployment sxwl-agent in {AGENT_NAMESPACE}")
        return False
    ready = int(data.get("status", {}).get("readyReplicas", 0) or 0)
    wanted = int(data.get("spec", {}).get("replicas", 1) or 1)
    mark = "[green]✓[/]" if ready >= wanted else "[red]✗[/]"
    console.print(f"{mark} agent: sxwl-agent {ready}/{wanted} ready")
    return ready >= wanted


def _cloud(ctx: Context, console: Console, check: KeyCheck) -> bool:
    cpod = check.cpod(ctx.config.name)
    if cpod is None:
        console.print(f"[red]✗[/] cloud: {ctx.cloud} has no CPod {ctx.config.name!r} for {check.provider}")
        return False
    mark = "[green]✓[/]" if cpod.status == "online" else "[red]✗[/]"
    console.print(f"{mark} cloud: CPod {cpod.name} is {cpod.status} on {ctx.cloud.rstrip('/')}/compute")
    return cpod.status == "online"


# --- add nodes --------------------------------------------------------------------------------------


def new_hosts(ctx: Context) -> list[str]:
    deployed = set(deployed_hosts(ctx))
    if not deployed:
        raise CtlError("no deployed cluster is recorded in this work dir: run `3kctl deploy all` first")
    return [h.name for h in ctx.config.cluster_hosts if h.name not in deployed]


def add_steps(ctx: Context, names: list[str]) -> list[Step]:
    def plan_pre(ctx: Context) -> list[str]:
        return [f"preflight on the new hosts only: {', '.join(names)}"]

    def run_pre(ctx: Context, log: TextIO) -> None:
        async def go() -> Report:
            async with ctx.pool() as pool:
                return await run_preflight(pool, ctx.config, [ctx.config.host(n) for n in names])

        report = run_sync(go())
        log.write(preflight_text(report) + "\n")
        if not report.ok:
            ctx.console.print(preflight_table(report))
            raise StepFailed("preflight found problems (✗) on the new hosts:\n" + failures_text(report))

    def plan_file(ctx: Context) -> list[str]:
        return [f"write {ctx.work.kubekey_config} (every host of the config, the new ones included)"]

    def run_file(ctx: Context, log: TextIO) -> None:
        text = kubekey.render(ctx.config, ctx.manifest)
        ctx.work.kubekey_config.write_text(text)
        log.write(text)

    def command(ctx: Context) -> Command:
        return kk_command(ctx, "add", "nodes", "--with-packages", "--yes")

    def run_add(ctx: Context, log: TextIO) -> None:
        ctx.call(ctx.tools.kk, log, command(ctx), "kk add nodes")
        ledger = ctx.ledger or Ledger(ctx.work.ledger)
        section = ledger.section(DEPLOY)
        section["hosts"] = [
            *section.get("hosts", []),
            *[n for n in names if n not in section.get("hosts", [])],
        ]
        ledger.save()

    return [
        Step("add-preflight", "check the new hosts", plan_pre, run_pre),
        Step("add-kubekey-config", "regenerate KubeKey's cluster file", plan_file, run_file),
        Step(
            "add-nodes", f"join {', '.join(names)} (kk add nodes)", lambda c: [command(c).display()], run_add
        ),
    ]


# --- delete node ------------------------------------------------------------------------------------


def delete_commands(ctx: Context, name: str) -> list[Command]:
    return [
        ctx.kubectl("drain", name, "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=300s"),
        Command([ctx.tools.kk_path, "delete", "node", name, "-f", str(ctx.work.kubekey_config), "--yes"]),
    ]


def check_deletable(ctx: Context, name: str) -> None:
    deployed = deployed_hosts(ctx)
    if name not in deployed:
        known = ", ".join(deployed) or "none recorded"
        raise UsageError(f"node {name!r} is not part of the deployed cluster (nodes: {known})")
    try:
        roles = ctx.config.roles_of(name)
    except KeyError:
        roles = []
    if name not in {h.name for h in ctx.config.hosts}:
        raise UsageError(
            f"{name!r} is no longer in {ctx.config.path}: KubeKey needs its entry to remove it; put it back, "
            "delete the node, then remove it from the config"
        )
    for role in ("control-plane", "etcd"):
        if role in roles and len(ctx.config.role_groups.get(role, [])) <= 1:
            raise UsageError(f"{name} is the only {role} host: the cluster cannot run without it")


def delete_node(ctx: Context, name: str, log: TextIO) -> None:
    ctx.work.kubekey_config.write_text(kubekey.render(ctx.config, ctx.manifest, deployed_hosts(ctx)))
    drain, remove = delete_commands(ctx, name)
    ctx.call(ctx.tools.kube, log, drain, f"kubectl drain {name}")
    ctx.call(ctx.tools.kk, log, remove, f"kk delete node {name}")
    ledger = Ledger(ctx.work.ledger)
    section = ledger.section(DEPLOY)
    section["hosts"] = [h for h in section.get("hosts", []) if h != name]
    ledger.save()
