"""The CPod config file (``conf/config-sample.conf``): load, expand ``name[a:b]``, validate.

The file is YAML in the shape of the provider guide, read as nodes (config_reader.py) so that every
problem names its line and column, checked by config_checks.py into the model of cluster.py."""

from __future__ import annotations

from pathlib import Path

from sxwl.ctl.cluster import ROLE_GROUPS, ClusterConfig, ConfigInvalid, expand
from sxwl.ctl.config_checks import Validator
from sxwl.ctl.errors import EXIT_USAGE, CtlError

__all__ = [
    "DEFAULT_CONFIG",
    "ROLE_GROUPS",
    "ClusterConfig",
    "ConfigInvalid",
    "expand",
    "load",
    "render_warnings",
]

DEFAULT_CONFIG = Path("conf/config-sample.conf")


def load(path: Path, *, check_keys: bool = True) -> ClusterConfig:
    """Loads and validates; raises ConfigInvalid (exit 2) listing every problem when there are errors."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise CtlError(
            f"config file {path} does not exist: run `3kctl init -o {path}` and fill in your hosts",
            EXIT_USAGE,
        ) from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as exc:
        raise CtlError(f"cannot read config file {path}: {exc}", EXIT_USAGE) from None
    validator = Validator(path, text, check_keys)
    config = validator.run()
    if config is None or any(p.severity == "error" for p in validator.problems):
        raise ConfigInvalid(path, validator.problems, validator.lines)
    config.warnings = validator.problems
    return config


def render_warnings(config: ClusterConfig) -> str:
    lines = config.text.splitlines()
    return "\n\n".join(p.render(config.path, lines) for p in config.warnings)
