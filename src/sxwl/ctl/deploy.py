"""The steps of ``3kctl deploy all``: config → preflight → artifact → KubeKey (registry, images,
Kubernetes) → kubeconfig → platform charts (node feature discovery, GPU operator) → the sxwl-agent
chart with the accessKey in a Secret → wait until the cloud shows the CPod online.

What the sxwl-agent chart (deploy/helm/sxwl-agent) is given: ``--set-string cloud.url=URL``,
``existingSecret=sxwl-agent`` (a Secret in ``sxwl-system`` with the keys ``SXWL_API_URL`` and
``SXWL_ACCESS_KEY``, applied from stdin by the agent-secret step so the key is never on a command
line), ``cpod.name=NAME``, and ``image.repository`` / ``image.tag`` from the manifest's values."""

from __future__ import annotations

import json
import re
import shlex
import sys
import time
from typing import TextIO

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from sxwl.ctl import kubekey
from sxwl.ctl.artifact import Chart, verify
from sxwl.ctl.cloud import check_access_key
from sxwl.ctl.preflight import FACTS_SCRIPT, SYMBOL, Report, run_preflight
from sxwl.ctl.runner import Command
from sxwl.ctl.ssh import SshPool, run_sync
from sxwl.ctl.steps import Context, Step, StepFailed

AGENT_NAMESPACE = "sxwl-system"
AGENT_SECRET = "sxwl-agent"  # noqa: S105 - the Secret's name
AGENT_CHART = "sxwl-agent"
REDACTED = "********"


# Short column titles keep the host × check table within a terminal; --json has the full names.
SHORT = {
    "reachable": "ssh",
    "memory": "mem",
    "hostname": "name",
    "machine-id": "id",
    "modules": "kmod",
    "nvidia": "gpu",
    "runtime": "cri",
}
SHORT_ROLES = {"control-plane": "cp", "etcd": "etcd", "worker": "worker", "registry": "reg"}


def preflight_table(report: Report, title: str = "preflight") -> Table:
    checks = list(next(iter(report.hosts)).checks) if report.hosts else []
    table = Table(
        title=title, caption=preflight_legend(checks), box=box.SIMPLE_HEAD, padding=0, pad_edge=False
    )
    table.add_column("host", no_wrap=True)
    table.add_column("roles", no_wrap=True)
    for check in checks:
        table.add_column(SHORT.get(check, check), justify="center", no_wrap=True)
    for host in report.hosts:
        table.add_row(
            host.host,
            ",".join(SHORT_ROLES.get(r, r) for r in host.roles),
            *(
                {"ok": "[green]✓[/]", "warn": "[yellow]⚠[/]", "fail": "[red]✗[/]", "skip": "[dim]-[/]"}[
                    host.checks[c].status
                ]
                for c in checks
            ),
        )
    return table


def print_preflight(out: Console, report: Report, *, as_json: bool) -> None:
    """The preflight table with a line per failed or warned check and its fix, or the JSON report."""
    if as_json:
        sys.stdout.write(json.dumps(report.to_json(), ensure_ascii=False, indent=2) + "\n")
        return
    out.print(preflight_table(report))
    notes = [
        (h.host, n, c) for h in report.hosts for n, c in h.checks.items() if c.status in ("fail", "warn")
    ]
    for host, name, check in notes:
        symbol = "[red]✗[/]" if check.status == "fail" else "[yellow]⚠[/]"
        out.print(f"{symbol} {host} {name}: {escape(check.detail)}", highlight=False)
        if check.fix:
            out.print(f"    fix: {escape(check.fix)}", highlight=False)
    verdict = (
        "[green]all hosts ready[/]"
        if report.ok
        else f"[red]{len(report.failures())} problem{'s' if len(report.failures()) != 1 else ''} to fix[/]"
    )
    out.print(f"{verdict} ({len(report.hosts)} hosts in {report.wall_s:.1f}s)")


def preflight_legend(checks: list[str]) -> str:
    names = ", ".join(f"{SHORT[c]}={c}" for c in checks if c in SHORT)
    return f"✓ ok  ⚠ warning  ✗ must fix  - not checked;  {names}; cp=control-plane, reg=registry"


def preflight_text(report: Report) -> str:
    lines = []
    for host in report.hosts:
        for name, check in host.checks.items():
            lines.append(f"{host.host:<16} {name:<11} {SYMBOL[check.status]} {check.detail}")
            if check.fix:
                lines.append(f"{'':<16} {'':<11}   fix: {check.fix}")
    return "\n".join(lines)


def host_outputs(pool: SshPool) -> str:
    """What every host answered, kept in the step's log."""
    parts = []
    for host, results in pool.results.items():
        for result in results:
            status = f"exit {result.exit_status}" if result.error is None else result.error
            parts.append(f"--- {host}: {status}\n{result.stdout}{result.stderr}")
    return "\n".join(parts) + "\n"


def failures_text(report: Report) -> str:
    return "\n".join(
        f"  ✗ {host} {name}: {c.detail}\n      fix: {c.fix}" for host, name, c in report.failures()
    )


# --- steps ------------------------------------------------------------------------------------------


def plan_config(ctx: Context) -> list[str]:
    return [f"validate {ctx.config.path} (done before any step; repeated for the ledger)"]


def run_config(ctx: Context, log: TextIO) -> None:
    for host in ctx.config.cluster_hosts:
        log.write(f"{host.describe()} roles={','.join(ctx.config.roles_of(host.name))}\n")
    log.write(f"CPod name: {ctx.config.name}\n")


def ssh_line(ctx: Context, host_name: str, command: str) -> str:
    host = ctx.config.host(host_name)
    key = f" -i {host.private_key_path}" if host.private_key_path else ""
    return f"ssh{key} -p {host.port} {host.user}@{host.address} {command}"


def plan_preflight(ctx: Context) -> list[str]:
    return [ssh_line(ctx, h.name, "sh -s < <preflight facts script>") for h in ctx.config.cluster_hosts] + [
        f"(the facts script, {len(FACTS_SCRIPT.splitlines())} lines: `3kctl preflight --show-script` "
        "prints it)"
    ]


def run_preflight_step(ctx: Context, log: TextIO) -> None:
    async def go() -> tuple[Report, str]:
        async with ctx.pool() as pool:
            report = await run_preflight(pool, ctx.config)
            return report, host_outputs(pool)

    report, outputs = run_sync(go())
    log.write(preflight_text(report) + "\n\n" + outputs)
    if not report.ok:
        ctx.console.print(preflight_table(report))
        raise StepFailed("preflight found problems (✗):\n" + failures_text(report))


def plan_artifact(ctx: Context) -> list[str]:
    return [
        f"sha256sum every file named in {ctx.manifest.root / 'manifest.yaml'} and compare with its checksums"
    ]


def run_artifact(ctx: Context, log: TextIO) -> None:
    result = verify(ctx.manifest.root)
    for path, verdict, detail in result.files:
        log.write(f"{verdict:<9} {path} {detail}\n")
    if not result.ok:
        raise StepFailed("the artifact does not match its manifest:\n  " + "\n  ".join(result.problems()))
    wanted = ctx.config.kubernetes_version
    if wanted and wanted != ctx.manifest.kubernetes_version:
        raise StepFailed(
            f"the config asks for Kubernetes {wanted}, the artifact carries "
            f"{ctx.manifest.kubernetes_version}: "
            "remove kubernetes.version from the config or use a matching artifact"
        )


def plan_kubekey_config(ctx: Context) -> list[str]:
    return [f"write {ctx.work.kubekey_config} (KubeKey's cluster file, generated from {ctx.config.path})"]


def run_kubekey_config(ctx: Context, log: TextIO) -> None:
    text = kubekey.render(ctx.config, ctx.manifest)
    ctx.work.kubekey_config.write_text(text)
    log.write(text)


def kk_command(ctx: Context, *args: str) -> Command:
    return Command(
        [ctx.tools.kk_path, *args, "-f", str(ctx.work.kubekey_config), "-a", str(ctx.kubekey_artifact)]
    )


def kk_step(name: str, title: str, *args: str) -> Step:
    def command(ctx: Context) -> Command:
        return kk_command(ctx, *args)

    def plan(ctx: Context) -> list[str]:
        return [command(ctx).display()]

    def run(ctx: Context, log: TextIO) -> None:
        ctx.call(ctx.tools.kk, log, command(ctx), f"kk {args[0]} {args[1]}")
        if name == "kubernetes":
            ctx.state["hosts"] = [h.name for h in ctx.config.cluster_hosts]

    return Step(name, title, plan, run)


def plan_kubeconfig(ctx: Context) -> list[str]:
    cp = ctx.first_control_plane()
    return [
        ssh_line(
            ctx, cp.name, f"sudo cat {ctx.tools.remote_admin_conf} > {ctx.work.kubeconfig}  (mode 0600)"
        ),
        ctx.kubectl("get", "nodes", "-o", "wide").display(),
    ]


def run_kubeconfig(ctx: Context, log: TextIO) -> None:
    cp = ctx.first_control_plane()

    async def fetch() -> str:
        async with ctx.pool() as pool:
            result = await pool.read_file(cp, ctx.tools.remote_admin_conf)
        if not result.ok:
            raise StepFailed(f"cannot read {ctx.tools.remote_admin_conf} on {cp.name}: {result.why()}")
        return result.stdout

    text = run_sync(fetch())
    # KubeKey's admin.conf names the control-plane domain, which resolves only on cluster nodes.
    text = re.sub(
        rf"https://{re.escape(kubekey.CONTROL_PLANE_DOMAIN)}:6443",
        f"https://{cp.internal_address}:6443",
        text,
    )
    ctx.work.write_private(ctx.work.kubeconfig, text.encode())
    log.write(f"kubeconfig of {cp.name} saved to {ctx.work.kubeconfig} (mode 0600)\n")
    ctx.call(ctx.tools.kube, log, ctx.kubectl("get", "nodes", "-o", "wide"), "kubectl get nodes")


def chart_step(chart: Chart) -> Step:
    def plan(ctx: Context) -> list[str]:
        return [
            f"write {ctx.values_path(chart)} (values from the manifest)",
            ctx.helm_install(chart).display(),
        ]

    def run(ctx: Context, log: TextIO) -> None:
        log.write(ctx.write_values(chart).read_text())
        ctx.call(ctx.tools.kube, log, ctx.helm_install(chart), f"helm install {chart.release}")

    return Step(chart.name, f"install chart {chart.name} {chart.version}", plan, run)


def agent_secret_manifest(ctx: Context, key: str) -> str:
    return (
        f"apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {AGENT_NAMESPACE}\n---\n"
        f"apiVersion: v1\nkind: Secret\nmetadata:\n  name: {AGENT_SECRET}\n  namespace: {AGENT_NAMESPACE}\n"
        f"type: Opaque\nstringData:\n  SXWL_API_URL: {ctx.cloud}\n  SXWL_ACCESS_KEY: {key}\n"
    )


def secret_command(ctx: Context) -> Command:
    return ctx.kubectl(
        "apply",
        "-f",
        "-",
        stdin=agent_secret_manifest(ctx, ctx.access_key or ""),
        shown=agent_secret_manifest(ctx, REDACTED),
    )


def plan_secret(ctx: Context) -> list[str]:
    return [secret_command(ctx).display()]


def run_secret(ctx: Context, log: TextIO) -> None:
    if not ctx.access_key:
        raise StepFailed("no accessKey: pass --access-key")
    ctx.call(ctx.tools.kube, log, secret_command(ctx), "kubectl apply (agent Secret)")


def agent_args(ctx: Context) -> list[str]:
    return [
        "--set-string",
        f"cloud.url={ctx.cloud}",
        "--set-string",
        f"existingSecret={AGENT_SECRET}",
        "--set-string",
        f"cpod.name={ctx.config.name}",
    ]


def agent_step(ctx: Context) -> Step:
    chart = ctx.manifest.chart(AGENT_CHART)

    def plan(ctx: Context) -> list[str]:
        return [f"write {ctx.values_path(chart)}", ctx.helm_install(chart, *agent_args(ctx)).display()]

    def run(ctx: Context, log: TextIO) -> None:
        log.write(ctx.write_values(chart).read_text())
        ctx.call(ctx.tools.kube, log, ctx.helm_install(chart, *agent_args(ctx)), "helm install sxwl-agent")

    return Step("sxwl-agent", f"install chart sxwl-agent {chart.version} (registers the CPod)", plan, run)


def plan_wait(ctx: Context) -> list[str]:
    return [
        f"poll GET {ctx.cloud}/api/v1/agent/access-key/check (Bearer accessKey) every "
        f"{ctx.poll_interval:g}s, up to "
        f"{ctx.wait_timeout:g}s, until CPod {ctx.config.name!r} is online"
    ]


def run_wait(ctx: Context, log: TextIO) -> None:
    deadline = time.monotonic() + ctx.wait_timeout
    name = ctx.config.name
    seen = "nothing yet"
    while True:
        check = check_access_key(ctx.cloud, ctx.access_key or "")
        cpod = check.cpod(name)
        seen = f"{cpod.name}: {cpod.status}" if cpod else "no CPod of that name"
        log.write(f"{time.strftime('%H:%M:%S')} {seen}\n")
        log.flush()
        if cpod is not None and cpod.status == "online":
            return
        if time.monotonic() >= deadline:
            known = ", ".join(f"{c.name} ({c.status})" for c in check.cpods) or "none"
            raise StepFailed(
                f"CPod {name!r} did not come online within {ctx.wait_timeout:g}s ({seen}; the "
                "provider's CPods: "
                f"{known}). Look at the agent: `kubectl --kubeconfig {ctx.work.kubeconfig} -n "
                f"{AGENT_NAMESPACE} "
                f"logs deploy/sxwl-agent` — it must reach {ctx.cloud}"
            )
        time.sleep(ctx.poll_interval)


def deploy_steps(ctx: Context) -> list[Step]:
    manifest = ctx.manifest
    platform = [chart_step(c) for c in manifest.charts if c.name != AGENT_CHART]
    return [
        Step("config", "validate the config", plan_config, run_config),
        Step("preflight", "check every host", plan_preflight, run_preflight_step),
        Step("artifact", "verify the offline artifact (manifest and checksums)", plan_artifact, run_artifact),
        Step("kubekey-config", "generate KubeKey's cluster file", plan_kubekey_config, run_kubekey_config),
        kk_step("registry", "install the private registry (kk init registry)", "init", "registry"),
        kk_step(
            "images", "push the artifact's images to it (kk artifact image push)", "artifact", "image", "push"
        ),
        kk_step(
            "kubernetes",
            "install Kubernetes (kk create cluster --with-packages)",
            "create",
            "cluster",
            "--with-packages",
            "--yes",
        ),
        Step("kubeconfig", "fetch the cluster's kubeconfig", plan_kubeconfig, run_kubeconfig),
        *platform,
        Step("agent-secret", "store the accessKey and cloud URL in a Secret", plan_secret, run_secret),
        agent_step(ctx),
        Step("wait-online", "wait until 算想云 shows the CPod online", plan_wait, run_wait),
    ]


def summary(ctx: Context, console: Console) -> None:
    url = ctx.cloud.rstrip("/") + "/compute"
    table = Table(show_header=False, box=None)
    table.add_row("CPod", f"{ctx.config.name} [green]online[/]")
    table.add_row("provider", ctx.provider)
    table.add_row(
        "nodes",
        ", ".join(f"{h.name} ({','.join(ctx.config.roles_of(h.name))})" for h in ctx.config.cluster_hosts),
    )
    table.add_row("算力详情", url)
    table.add_row("kubeconfig", str(ctx.work.kubeconfig))
    table.add_row("logs", str(ctx.work.logs))
    console.print("\n[bold green]CPod deployed.[/]")
    console.print(table)
    console.print(
        "next: `3kctl deploy install ceph` for storage (optional), `3kctl status`, and "
        f"`kubectl --kubeconfig {shlex.quote(str(ctx.work.kubeconfig))} get pods -A`"
    )
