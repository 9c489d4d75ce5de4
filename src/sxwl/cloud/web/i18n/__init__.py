"""Console texts in zh-CN (default) and English, one table per area (common, jobs, compute, money,
finetune, storage, console, models, endpoints), merged here; reasons/events are worded from their codes by
``reasons``."""

from __future__ import annotations

from sxwl.cloud.web.i18n.common import COMMON_MESSAGES
from sxwl.cloud.web.i18n.compute import COMPUTE_MESSAGES
from sxwl.cloud.web.i18n.console import CONSOLE_MESSAGES, SINGULAR
from sxwl.cloud.web.i18n.devenvs import DEVENVS_MESSAGES
from sxwl.cloud.web.i18n.endpoints import ENDPOINTS_MESSAGES
from sxwl.cloud.web.i18n.finetune import FINETUNE_MESSAGES
from sxwl.cloud.web.i18n.jobs import JOBS_MESSAGES
from sxwl.cloud.web.i18n.models import MODELS_MESSAGES
from sxwl.cloud.web.i18n.money import MONEY_MESSAGES
from sxwl.cloud.web.i18n.storage import STORAGE_MESSAGES

LANGUAGES = ("zh", "en")
DEFAULT_LANGUAGE = "zh"

# One table per area, each readable on its own; a key in two tables would be a mistake (tested).
TABLES: tuple[dict[str, dict[str, str]], ...] = (
    COMMON_MESSAGES,
    JOBS_MESSAGES,
    COMPUTE_MESSAGES,
    MONEY_MESSAGES,
    FINETUNE_MESSAGES,
    STORAGE_MESSAGES,
    CONSOLE_MESSAGES,
    MODELS_MESSAGES,
    DEVENVS_MESSAGES,
    ENDPOINTS_MESSAGES,
)
MESSAGES: dict[str, dict[str, str]] = {lang: {} for lang in LANGUAGES}
for _table in TABLES:
    for _lang, _texts in _table.items():
        MESSAGES[_lang].update(_texts)


def translate(lang: str, key: str, **values: object) -> str:
    text = MESSAGES.get(lang, MESSAGES[DEFAULT_LANGUAGE]).get(key) or MESSAGES[DEFAULT_LANGUAGE].get(key, key)
    if values.get("n") == 1:  # "1 example", not "1 examples"
        text = SINGULAR.get(lang, {}).get(key, text)
    return text.format(**values) if values else text
