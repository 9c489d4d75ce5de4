"""Console texts of the job and fine-tune pages added after their first tables (banners that follow
the live state, a finished job's cost, how code reaches a CPod) and the singular forms of English
counts, in zh-CN and English; the package merges them into one table.

English counts of one have their own texts (SINGULAR); Chinese needs none."""

from __future__ import annotations

CONSOLE_MESSAGES: dict[str, dict[str, str]] = {
    "zh": {
        "job.cost_total": "总费用",
        "ft.cost_total": "总费用",
        "ft.notice.created_plain": "微调已创建。",
        "job_new.code_title": "代码如何到达 CPod",
        "job_new.code_kube": "没有代码上传：命令在 CPod 上运行，只能用那里已有的文件。Kubernetes CPod 在你填写的镜像中运行任务，把代码放进镜像（或让命令下载它）。",
        "job_new.code_local": "本机（local）CPod 不使用镜像：命令在 CPod 主机上的沙箱中运行，能用的是主机上已安装的程序（例如 python3 和 sh；不一定有 python）和主机上已有的文件（写绝对路径）；只有提供方允许出站网络时命令才能下载。",
    },
    "en": {
        "job.cost_total": "Cost",
        "ft.cost_total": "Cost",
        "ft.notice.created_plain": "The fine-tune was created.",
        "job_new.code_title": "How your code reaches the CPod",
        "job_new.code_kube": "There is no code upload: the command runs on the CPod with what is already there. A Kubernetes CPod runs the job in the image you name: put your code in the image (or let the command download it).",
        "job_new.code_local": "A local CPod uses no image: the command runs in a sandbox on the CPod's machine, with the programs installed there (python3 and sh, for example; python may be missing) and the files already on it (give absolute paths); it can download only where the provider allows outbound network.",
    },
}

# The text of a key when its ``n`` is 1, where the language tells one from many (i18n.translate).
SINGULAR: dict[str, dict[str, str]] = {
    "en": {
        "ft.field.examples": "{n} example",
        "ft.files.result_ok_body": "{n} example ({format}): ready to fine-tune on.",
        "ft.files.result_bad_body": "1 problem found; the file cannot be used for fine-tuning. Fix this line and upload it again:",
        "ft.files.more_problems": "1 more problem not listed.",
        "ft.files.show_problems": "Show 1 problem",
        "ft.files.tokens": "1 token ({model})",
        "event.detail.nodes": "1 node reported",
        "event.detail.missed": "1 heartbeat missed",
        "compute.input_cache.held": "1 item · {size}",
        "job.env.too_many": "At most 1 variable.",
    },
}
