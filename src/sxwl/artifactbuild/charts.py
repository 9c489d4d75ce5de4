"""charts/: the agent's chart packaged from deploy/helm/sxwl-agent, and the third-party charts the
manifest names, packaged from their sources at the pinned versions. A chart's ``source`` in the
manifest names the Go module that carries it (the module proxy serves a repository's files at a
tag, the one source these build machines reach) and the chart's folder in it."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from sxwl.artifactbuild.pack import normalise_tgz
from sxwl.artifactbuild.parts import Missing

AGENT_CHART = Path("deploy/helm/sxwl-agent")
GENERATED = "1980-01-01T00:00:00Z"


@dataclass(frozen=True)
class ChartSource:
    module: str  # e.g. github.com/rook/rook
    version: str  # the module's tag
    folder: str  # the chart's folder in the module


def _helm(helm: Path, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    # helm must not read the build user's repositories or cache: only what is passed.
    env = {**os.environ, "HELM_CACHE_HOME": "/nonexistent", "HELM_REPOSITORY_CONFIG": "/nonexistent"}
    return subprocess.run(
        [str(helm), *args], cwd=cwd, env=env, capture_output=True, text=True, check=False, timeout=300
    )


def package(helm: Path, chart: Path, version: str, root: Path, name: str) -> Path | Missing:
    """``helm package`` at ``version`` as root/name, made reproducible (name is the manifest's path)."""
    work = root.parent / f".package-{chart.name}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    try:
        if (chart / "Chart.yaml").read_text().find("dependencies:") >= 0:
            result = _helm(helm, "dependency", "build", str(chart))
            if result.returncode != 0:
                return Missing(name, f"helm dependency build {chart.name}: {result.stderr.strip()[-300:]}")
            # helm dates the lock file it writes; the artifact must not carry the build's time.
            lock = chart / "Chart.lock"
            if lock.is_file():
                lock.write_text(re.sub(r"(?m)^generated: .*$", f'generated: "{GENERATED}"', lock.read_text()))
        app_version = version
        result = _helm(
            helm, "package", str(chart), "--version", version, "--app-version", app_version, "-d", str(work)
        )
        if result.returncode != 0:
            return Missing(name, f"helm package {chart.name}: {result.stderr.strip()[-300:]}")
        [made] = list(work.glob("*.tgz"))
        target = root / name
        target.parent.mkdir(parents=True, exist_ok=True)
        made.replace(target)
        normalise_tgz(target)
        return target
    finally:
        shutil.rmtree(work, ignore_errors=True)


def agent_chart(repo: Path, helm: Path, version: str, root: Path, name: str) -> Path | Missing:
    return package(helm, repo / AGENT_CHART, version, root, name)


def third_party(source: ChartSource, helm: Path, version: str, root: Path, name: str) -> Path | Missing:
    if shutil.which("go") is None:
        return Missing(name, "the 'go' command is needed to fetch the chart's sources")
    result = subprocess.run(
        ["go", "mod", "download", "-json", f"{source.module}@{source.version}"],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
        cwd="/",
        env={**os.environ, "GOFLAGS": "-mod=mod"},
    )
    try:
        info = json.loads(result.stdout)
    except ValueError:
        info = {"Error": result.stderr.strip() or "no answer"}
    if info.get("Error") or not info.get("Dir"):
        first = str(info.get("Error", "")).splitlines()[0] if info.get("Error") else "not downloaded"
        return Missing(
            name, f"the sources of {source.module}@{source.version} are not reachable here: {first}"
        )
    # The module cache is read-only and a chart may need its siblings (file://../library): copy the
    # folder above the chart.
    module_dir = Path(str(info["Dir"]))
    chart_dir = module_dir / source.folder
    if not (chart_dir / "Chart.yaml").is_file():
        return Missing(name, f"{source.module}@{source.version} has no chart at {source.folder}")
    copy = root.parent / f".src-{chart_dir.name}"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(chart_dir.parent, copy, copy_function=shutil.copyfile)
    for folder in [copy, *[p for p in copy.rglob("*") if p.is_dir()]]:
        folder.chmod(0o755)
    try:
        return package(helm, copy / chart_dir.name, version, root, name)
    finally:
        shutil.rmtree(copy, ignore_errors=True)
