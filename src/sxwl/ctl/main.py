"""Entry point of ``3kctl``, the CPod deployment tool (commands and flags: docs/provider-guide.*)."""

from __future__ import annotations

import getpass
import os
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from sxwl.ctl import config as cfg
from sxwl.ctl import deploy, ops
from sxwl.ctl.artifact import default_root, usable, verify, write_checksums
from sxwl.ctl.ceph import ceph_steps, discover
from sxwl.ctl.cloud import DEFAULT_CLOUD, check_access_key, refuses_artifact
from sxwl.ctl.errors import EXIT_FAILED, EXIT_PARTIAL, CtlError, UsageError
from sxwl.ctl.preflight import FACTS_SCRIPT, Report, run_preflight
from sxwl.ctl.runner import select_tools
from sxwl.ctl.sample import SAMPLE_CONFIG
from sxwl.ctl.ssh import DEFAULT_CONCURRENCY, DEFAULT_CONNECT_TIMEOUT, KnownHosts, SshPool, run_sync
from sxwl.ctl.sshsetup import SetupResult, ensure_key_pair, hosts_needing_password, setup_host
from sxwl.ctl.steps import Context, StepFailed, execute
from sxwl.ctl.workdir import WorkDir

app = typer.Typer(
    help="3kctl: turn your GPU servers into a CPod of 算想云 (config → ssh setup → preflight → deploy all).",
    no_args_is_help=True,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
check_app = typer.Typer(help="Validate inputs.", no_args_is_help=True)
ssh_app = typer.Typer(help="SSH trust to the hosts.", no_args_is_help=True)
deploy_app = typer.Typer(help="Deploy the CPod.", no_args_is_help=True)
install_app = typer.Typer(help="Optional components.", no_args_is_help=True)
add_app = typer.Typer(help="Grow the CPod.", no_args_is_help=True)
delete_app = typer.Typer(help="Shrink the CPod.", no_args_is_help=True)
artifact_app = typer.Typer(help="The offline artifact.", no_args_is_help=True)
app.add_typer(check_app, name="check")
app.add_typer(ssh_app, name="ssh")
app.add_typer(deploy_app, name="deploy")
deploy_app.add_typer(install_app, name="install")
app.add_typer(add_app, name="add")
app.add_typer(delete_app, name="delete")
app.add_typer(artifact_app, name="artifact")

out = Console(soft_wrap=True, highlight=False)
err = Console(stderr=True, soft_wrap=True, highlight=False)

ConfigFile = Annotated[
    Path, typer.Option("--file", "-f", envvar="SXWL_3KCTL_CONFIG", help="The CPod config file.")
]
WorkDirOpt = Annotated[
    Path | None,
    typer.Option(
        "--work-dir",
        envvar="SXWL_3KCTL_WORK_DIR",
        help="Known host keys, logs and state (default: .3kctl beside the config).",
    ),
]
Parallel = Annotated[int, typer.Option("--parallel", min=1, help="Hosts handled at once.")]
ConnectTimeout = Annotated[float, typer.Option("--connect-timeout", min=0.1, help="Seconds to wait for SSH.")]
ArtifactOpt = Annotated[
    Path | None, typer.Option("--artifact", help="The unpacked offline artifact (default: where 3kctl lies).")
]
DryRun = Annotated[
    bool, typer.Option("--dry-run", help="Print the plan with the exact commands; run nothing.")
]
Resume = Annotated[bool, typer.Option("--resume", help="Skip the steps a previous run completed.")]
AccessKey = Annotated[
    str | None,
    typer.Option(
        "--access-key", envvar="SXWL_ACCESS_KEY", help="Your accessKey from the console (or SXWL_ACCESS_KEY)."
    ),
]
Cloud = Annotated[str, typer.Option("--cloud", envvar="SXWL_API_URL", help="The cloud's URL.")]
Yes = Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")]


def load(path: Path, check_keys: bool = True) -> cfg.ClusterConfig:
    config = cfg.load(path, check_keys=check_keys)
    if config.warnings:
        err.print(cfg.render_warnings(config), markup=False, highlight=False, soft_wrap=True)
    return config


def context(
    config: cfg.ClusterConfig,
    work_dir: Path | None,
    *,
    artifact: Path | None = None,
    parallel: int = DEFAULT_CONCURRENCY,
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
) -> Context:
    work = WorkDir.for_config(config.path, work_dir).ensure()
    root = artifact.resolve() if artifact is not None else default_root()
    ctx = Context(
        config=config,
        work=work,
        tools=select_tools(root),
        console=out,
        artifact_root=root,
        concurrency=parallel,
        connect_timeout=connect_timeout,
    )
    if ctx.tools.fakes:
        err.print(f"[yellow]note:[/] test stand-ins in use: {', '.join(ctx.tools.fakes)}")
    return ctx


@app.command()
def init(
    output: Annotated[
        Path, typer.Option("--output", "-o", help="Where to write the sample.")
    ] = cfg.DEFAULT_CONFIG,
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing file.")] = False,
) -> None:
    """Write a commented sample config (the guide's example, correctly indented)."""
    if output.exists() and not force:
        raise UsageError(f"{output} exists: edit it, or pass --force to replace it with the sample")
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(SAMPLE_CONFIG)
    out.print(f"wrote {output}: fill in your hosts, then run `3kctl check config -f {output}`")


@check_app.command("config")
def check_config(file: ConfigFile = cfg.DEFAULT_CONFIG) -> None:
    """Validate the config; every problem names its line and a fix (exit 2 when invalid)."""
    config = load(file)
    roles = ", ".join(f"{role} {len(config.role_groups.get(role, []))}" for role in cfg.ROLE_GROUPS)
    out.print(f"{file}: OK — CPod {config.name!r}, {len(config.hosts)} hosts ({roles})")


@ssh_app.command("setup")
def ssh_setup(
    file: ConfigFile = cfg.DEFAULT_CONFIG,
    work_dir: WorkDirOpt = None,
    password_stdin: Annotated[
        bool, typer.Option("--password-stdin", help="Read the hosts' password from standard input.")
    ] = False,
    parallel: Parallel = DEFAULT_CONCURRENCY,
    connect_timeout: ConnectTimeout = DEFAULT_CONNECT_TIMEOUT,
) -> None:
    """Create the key pair if missing and install it on every host (step 1 of the guide)."""
    config = load(file, check_keys=False)
    work = WorkDir.for_config(config.path, work_dir).ensure()
    keys: dict[Path, str] = {}
    for host in config.hosts:
        path = host.private_key_path
        if path is None:
            raise UsageError(
                f"{host.name} has no privateKeyPath: `ssh setup` installs that key (set it in {file})"
            )
        if path not in keys:
            created, public = ensure_key_pair(path)
            keys[path] = public
            out.print(f"{'created' if created else 'using'} key pair {path} (+ .pub)")
    password: str | None = None
    if hosts_needing_password(config):
        if password_stdin:
            password = sys.stdin.readline().rstrip("\n")
        elif sys.stdin.isatty():
            password = getpass.getpass("SSH password for the hosts (asked once, never stored): ")

    async def go() -> dict[str, SetupResult]:
        async with SshPool(KnownHosts(work.known_hosts), parallel, connect_timeout) as pool:
            return await pool.each(
                config.hosts,
                lambda h: setup_host(pool, h, keys[h.private_key_path], password),  # type: ignore[index]
            )

    results = run_sync(go())
    table = Table("host", "address", "result", "detail", title="ssh setup")
    for host in config.hosts:
        result = results[host.name]
        mark = "[green]✓[/]" if result.ok else "[red]✗[/]"
        table.add_row(
            host.name,
            f"{host.user}@{host.address}:{host.port}",
            f"{mark} {result.status}",
            result.detail,
        )
    out.print(table)
    failed = [r for r in results.values() if not r.ok]
    if failed:
        raise CtlError(f"ssh setup failed on {len(failed)} of {len(results)} hosts (see the table)")
    if any(h.password for h in config.hosts):
        out.print(
            f"[yellow]the hosts can now be reached with the key: remove the `password` fields from {file}[/]"
        )
    out.print(f"host keys recorded in {work.known_hosts}")


@app.command()
def preflight(
    file: ConfigFile = cfg.DEFAULT_CONFIG,
    work_dir: WorkDirOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable report.")] = False,
    parallel: Parallel = DEFAULT_CONCURRENCY,
    connect_timeout: ConnectTimeout = DEFAULT_CONNECT_TIMEOUT,
    show_script: Annotated[
        bool, typer.Option("--show-script", help="Print the script run on each host.")
    ] = False,
) -> None:
    """Check every host in parallel (reachable, OS, arch, sudo, CPU, memory, disk, hostname, machine-id,
    clock, swap, kernel modules, ports, NVIDIA driver, container runtime); exit 1 on any ✗."""
    if show_script:
        sys.stdout.write(FACTS_SCRIPT.lstrip("\n"))
        return
    config = load(file)
    work = WorkDir.for_config(config.path, work_dir).ensure()

    async def go() -> Report:
        async with SshPool(KnownHosts(work.known_hosts), parallel, connect_timeout) as pool:
            return await run_preflight(pool, config)

    report = run_sync(go())
    work.log("preflight").write_text(deploy.preflight_text(report) + "\n")
    deploy.print_preflight(out, report, as_json=as_json)
    if not report.ok:
        raise typer.Exit(EXIT_FAILED)


def verified_key(access_key: str | None, cloud: str, dry_run: bool, version: str = "") -> tuple[str, str]:
    if not access_key:
        raise UsageError("--access-key is required: copy it from the console (账户 / Account page)")
    try:
        check = check_access_key(cloud, access_key)
    except CtlError as exc:
        if dry_run and "cannot reach" in str(exc):
            err.print(f"[yellow]warning:[/] {exc} (ignored for --dry-run)")
            return access_key, "?"
        raise
    refused = refuses_artifact(check, cloud, version) if version else None
    if refused:
        raise CtlError(refused)
    out.print(f"accessKey accepted by {cloud} (provider {check.provider})")
    return access_key, check.provider


@deploy_app.command("all")
def deploy_all(
    access_key: AccessKey = None,
    cloud: Annotated[
        str | None,
        typer.Option(
            "--cloud",
            envvar="SXWL_API_URL",
            help="The cloud's URL (default: the one the artifact came from).",
        ),
    ] = None,
    file: ConfigFile = cfg.DEFAULT_CONFIG,
    artifact: ArtifactOpt = None,
    dry_run: DryRun = False,
    resume: Resume = False,
    work_dir: WorkDirOpt = None,
    wait_timeout: Annotated[
        float, typer.Option("--wait-timeout", min=1, help="Seconds to wait for the CPod to come online.")
    ] = 900,
    parallel: Parallel = DEFAULT_CONCURRENCY,
    connect_timeout: ConnectTimeout = DEFAULT_CONNECT_TIMEOUT,
) -> None:
    """Verify the accessKey, then build the CPod step by step and wait until 算想云 shows it online."""
    config = load(file)
    manifest = usable(artifact.resolve() if artifact is not None else default_root())
    cloud = cloud or (manifest.cloud if manifest else "") or DEFAULT_CLOUD
    key, provider = verified_key(access_key, cloud, dry_run, manifest.version if manifest else "")
    ctx = context(config, work_dir, artifact=artifact, parallel=parallel, connect_timeout=connect_timeout)
    ctx.access_key, ctx.cloud, ctx.provider, ctx.wait_timeout = key, cloud.rstrip("/"), provider, wait_timeout
    ctx.poll_interval = float(os.environ.get("SXWL_3KCTL_POLL_INTERVAL", "2"))
    execute(ctx, "deploy all", deploy.deploy_steps(ctx), resume=resume, dry_run=dry_run)
    if not dry_run:
        deploy.summary(ctx, out)


@install_app.command("ceph")
def install_ceph(
    file: ConfigFile = cfg.DEFAULT_CONFIG,
    artifact: ArtifactOpt = None,
    dry_run: DryRun = False,
    resume: Resume = False,
    yes: Yes = False,
    work_dir: WorkDirOpt = None,
    wait_timeout: Annotated[
        float, typer.Option("--wait-timeout", min=1, help="Seconds to wait for HEALTH_OK.")
    ] = 1800,
) -> None:
    """Rook-Ceph on the workers' disks, then StorageClasses rook-ceph-block (default) and rook-cephfs."""
    config = load(file)
    ctx = context(config, work_dir, artifact=artifact)
    ctx.wait_timeout = wait_timeout
    ctx.poll_interval = float(os.environ.get("SXWL_3KCTL_POLL_INTERVAL", "5"))
    if not dry_run:
        ops.require_cluster(ctx)
    if not config.ceph_devices:
        if dry_run:
            ctx.extra["discover_pending"] = True
        else:
            found = discover(ctx, config.workers)
            listed = "; ".join(
                f"{host}: " + (", ".join(f"{d} ({s / 1024**3:.0f} GiB)" for d, s in devs) or "none")
                for host, devs in found.items()
            )
            out.print(f"empty disks (no partition, filesystem or mount): {listed}")
            if not any(found.values()):
                raise CtlError(
                    "no empty disk on any worker: attach disks or name them in the config (`ceph: "
                    "{devices: [sdb]}`)"
                )
            if not yes and not typer.confirm("Ceph will ERASE these disks. Use them?"):
                raise CtlError(
                    "not confirmed: name the devices in the config (`ceph: {devices: [...]}`) or pass --yes"
                )
            ctx.extra["ceph_nodes"] = {host: [d for d, _ in devs] for host, devs in found.items()}
    execute(ctx, "deploy install ceph", ceph_steps(), resume=resume, dry_run=dry_run)
    if not dry_run:
        out.print(
            "[bold green]Ceph is HEALTH_OK[/]; default StorageClass rook-ceph-block, shared file "
            "system rook-cephfs"
        )


@app.command()
def status(
    file: ConfigFile = cfg.DEFAULT_CONFIG,
    artifact: ArtifactOpt = None,
    work_dir: WorkDirOpt = None,
    access_key: AccessKey = None,
    cloud: Cloud = DEFAULT_CLOUD,
) -> None:
    """Nodes, platform components, the agent and the CPod as the cloud sees it (exit 1 if unhealthy)."""
    config = load(file, check_keys=False)
    ctx = context(config, work_dir, artifact=artifact)
    ctx.cloud = cloud.rstrip("/")
    try:
        ctx.manifest  # noqa: B018 - loads it if there is one
    except CtlError:
        ctx.artifact_root = None
    if not ops.status(ctx, out, access_key):
        raise typer.Exit(EXIT_FAILED)


@add_app.command("nodes")
def add_nodes(
    file: ConfigFile = cfg.DEFAULT_CONFIG,
    artifact: ArtifactOpt = None,
    dry_run: DryRun = False,
    resume: Resume = False,
    work_dir: WorkDirOpt = None,
) -> None:
    """Join the hosts added to the config since the last deploy (only those; no full re-run)."""
    config = load(file)
    ctx = context(config, work_dir, artifact=artifact)
    names = ops.new_hosts(ctx)
    if not names:
        out.print(f"every host in {file} is already part of the CPod: add hosts (and their roles) first")
        return
    out.print(f"new hosts: {', '.join(names)}")
    execute(ctx, "add nodes", ops.add_steps(ctx, names), resume=resume, dry_run=dry_run)
    if not dry_run:
        out.print(f"[bold green]added {', '.join(names)}[/]; `3kctl status` shows them")


@delete_app.command("node")
def delete_node(
    name: Annotated[str, typer.Argument(help="The node (host name in the config).")],
    file: ConfigFile = cfg.DEFAULT_CONFIG,
    artifact: ArtifactOpt = None,
    dry_run: DryRun = False,
    yes: Yes = False,
    work_dir: WorkDirOpt = None,
) -> None:
    """Drain a node and remove it from the cluster."""
    config = load(file, check_keys=False)
    ctx = context(config, work_dir, artifact=artifact)
    ops.check_deletable(ctx, name)
    if dry_run:
        out.print(f"[bold]Plan of `delete node {name}`[/] (nothing is run):")
        out.print(f"  write {ctx.work.kubekey_config}", markup=False)
        for command in ops.delete_commands(ctx, name):
            out.print("  $ " + command.display(), markup=False, highlight=False, soft_wrap=True)
        return
    ops.require_cluster(ctx)
    if not yes and not typer.confirm(f"Drain {name} and remove it from the cluster?"):
        raise CtlError("not confirmed")
    log_path = ctx.work.log(f"delete-node-{name}")
    with log_path.open("a") as log:
        try:
            ops.delete_node(ctx, name, log)
        except StepFailed as exc:
            raise CtlError(f"{exc}\n  log: {log_path}") from None
    out.print(f"[bold green]{name} removed[/]; now delete it from `hosts:` and `roleGroups:` in {file}")


@artifact_app.command("verify")
def artifact_verify(
    path: Annotated[
        Path | None, typer.Argument(help="The unpacked artifact (default: where 3kctl lies).")
    ] = None,
) -> None:
    """Check the artifact's files against manifest.yaml's sha256 checksums."""
    root = (path or default_root()).resolve()
    result = verify(root)
    bad = 0
    for relative, verdict, detail in result.files:
        if verdict == "ok":
            continue
        bad += verdict != "extra"
        symbol = "[yellow]⚠[/]" if verdict == "extra" else "[red]✗[/]"
        out.print(f"{symbol} {escape(relative)}: {escape(detail)}", highlight=False)
    checked = sum(1 for _, v, _ in result.files if v == "ok")
    if result.partial:
        raise CtlError(
            f"{root}: PARTIAL artifact {result.manifest.version}: {bad} part{'s' if bad != 1 else ''} "
            f"missing (the build could not make them; see PARTIAL.txt); {checked} files OK. It cannot "
            "deploy a CPod: use a complete artifact",
            EXIT_PARTIAL,
        )
    if not result.ok:
        raise CtlError(f"{root}: {bad} problem{'s' if bad != 1 else ''}; {checked} files OK")
    out.print(
        f"{root}: artifact {result.manifest.version} OK — {checked} files match manifest.yaml "
        f"(Kubernetes {result.manifest.kubernetes_version}, {len(result.manifest.charts)} charts, "
        f"{len(result.manifest.images)} images)"
    )


@artifact_app.command("checksum", hidden=True)
def artifact_checksum(path: Annotated[Path, typer.Argument(help="The artifact folder being built.")]) -> None:
    """Fill manifest.yaml's checksums with every file of the artifact (used by the build)."""
    count = write_checksums(path)
    out.print(f"{path / 'manifest.yaml'}: {count} checksums written")


def main() -> None:
    try:
        app()
    except CtlError as exc:
        prefix = "" if isinstance(exc, cfg.ConfigInvalid) else "[red]error:[/] "
        err.print(prefix + escape(str(exc)), highlight=False, soft_wrap=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        err.print("[red]interrupted[/]")
        sys.exit(EXIT_FAILED)
