"""The cloud's settings as the ``sxwl`` commands that work on the server's own database read them.
Apart from ``server`` so that those commands start without importing the web application, and the
settings themselves imported when asked for, so that no other command loads them."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sxwl.cloud.config import Settings
    from sxwl.cloud.kit import logs


def settings_for(
    data_dir: Path, port: int | None = None, host: str = "127.0.0.1", log_format: logs.LogFormat | None = None
) -> Settings:
    from sxwl.cloud.config import Settings

    if log_format is not None:  # the flag wins over the environment, and is validated like it
        os.environ["SXWL_LOG_FORMAT"] = log_format
    settings = Settings(data_dir=data_dir)  # absolute from here on (Settings resolves it)
    os.environ.setdefault("SXWL_DATA_DIR", str(settings.data_dir))
    if port is not None and not settings.public_url:
        shown = "127.0.0.1" if host in ("0.0.0.0", "::") else host  # noqa: S104 - comparing, not binding
        settings = settings.model_copy(update={"public_url": f"http://{shown}:{port}"})
    return settings
