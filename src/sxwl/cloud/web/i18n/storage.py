"""Console texts about each user's storage quota (the account page, refused uploads) in zh-CN and
English; the package merges them into one table."""

from __future__ import annotations

STORAGE_MESSAGES: dict[str, dict[str, str]] = {
    "zh": {
        "storage.title": "存储空间",
        "storage.help": "您的文件、上传的基础模型和任务产物共用这一份配额（日志不计入）。",
        "storage.used": "已用 {used}，共 {limit}",
        "storage.used_unlimited": "已用 {used}（不限量）",
        "storage.files": "文件",
        "storage.models": "基础模型",
        "storage.artifacts": "任务产物",
        "storage.full": "存储空间已满：新的上传和任务产物会被拒绝。请删除不需要的文件。",
        "storage.refused": "存储空间不足：已用 {used}，共 {limit}。请删除不需要的文件后重试。",
    },
    "en": {
        "storage.title": "Storage",
        "storage.help": "Your files, uploaded base models and job artifacts share this quota (logs do not count).",
        "storage.used": "{used} of {limit} used",
        "storage.used_unlimited": "{used} used (no limit)",
        "storage.files": "Files",
        "storage.models": "Base models",
        "storage.artifacts": "Job artifacts",
        "storage.full": "Storage is full: new uploads and job artifacts will be refused. Delete files you no longer need.",
        "storage.refused": "Not enough storage: {used} of {limit} used. Delete files you no longer need and try again.",
    },
}
