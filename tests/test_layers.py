"""The layering check of `make lint` (scripts/check_layers.py): clean on the tree, and it names a
planted upward import, a planted circle and a planted long file."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHECK = ROOT / "scripts" / "check_layers.py"


def check(src: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(CHECK), str(src)], capture_output=True, text=True, timeout=120)


@pytest.fixture
def src_copy(tmp_path: Path) -> Path:
    copy = tmp_path / "src"
    shutil.copytree(ROOT / "src", copy, ignore=shutil.ignore_patterns("__pycache__"))
    return copy


def plant(path: Path, line: str) -> None:
    path.write_text(path.read_text() + "\n" + line + "\n")


def test_the_tree_keeps_its_layers() -> None:
    result = check(ROOT / "src")
    assert result.returncode == 0, result.stdout


def test_a_domain_importing_one_above_it_is_named(src_copy: Path) -> None:
    module = src_copy / "sxwl/cloud/services/jobs/job_events.py"
    plant(module, "from sxwl.cloud.services.finetune import fine_tunes  # noqa: E402")
    result = check(src_copy)
    assert result.returncode == 1
    assert "services/jobs/job_events.py" in result.stdout
    assert "the jobs domain imports sxwl.cloud.services.finetune.fine_tunes" in result.stdout


def test_a_service_importing_the_api_is_named(src_copy: Path) -> None:
    plant(src_copy / "sxwl/cloud/services/money/prices.py", "from sxwl.cloud.api import deps  # noqa: E402")
    result = check(src_copy)
    assert result.returncode == 1
    assert "imports sxwl.cloud.api.deps, a layer above it" in result.stdout


def test_a_circle_and_a_long_file_are_named(src_copy: Path) -> None:
    plant(src_copy / "sxwl/cloud/kit/notify.py", "from sxwl.cloud.kit import groupcommit  # noqa: E402")
    plant(src_copy / "sxwl/cloud/kit/groupcommit.py", "from sxwl.cloud.kit import notify  # noqa: E402")
    long = src_copy / "sxwl/cloud/kit/security.py"
    long.write_text(long.read_text() + "\n" * 500)
    result = check(src_copy)
    assert result.returncode == 1
    assert "import circle: sxwl.cloud.kit.groupcommit -> sxwl.cloud.kit.notify" in result.stdout
    assert "kit/security.py:" in result.stdout and "(at most 450" in result.stdout
