"""Reasons and events in the console's languages, by their code (protocol/reasons.py): the Chinese
here, the English the API's own. A row from before the codes is shown as it was stored."""

from __future__ import annotations

from sxwl.protocol.reasons import ENGLISH, Reason, render

ZH: dict[str, str] = {
    "need.cpu": "仅 CPU 的节点",
    "need.gpus": "{gpus} × {product}",
    "need.gpus_any": "{gpus} × GPU",
    "need.nodes": "{nodes} 个节点、每个 {each}",
    "queue.scheduler": "等待调度",
    "queue.pinned_offline": "指定的 CPod {cpod} 不在线",
    "queue.no_gpus": "没有在线的 CPod 提供 GPU；此任务需要 {need}",
    "queue.never_fits": "没有在线的 CPod 能提供 {need}",
    "queue.busy": "等待 {need} 空闲",
    "queue.image": "提供 {need} 的 CPod 以本地进程运行任务，无法运行容器镜像：请不指定镜像提交，或等待 Kubernetes CPod",
    "queue.no_trainer": "提供 {need} 的 CPod 不运行微调（Kubernetes CPod 的 agent 需要 --trainer-image）：请等待能运行微调的 CPod",
    "queue.no_trainer_restricted": "提供 {need} 的 CPod 不运行微调（Kubernetes CPod 的 agent 需要 --trainer-image），"
    "或只接收其算力源及其信任的账户的任务",
    "queue.restricted": "提供 {need} 的 CPod 不隔离任务，只接收其算力源及其信任的账户的任务",
    "queue.limit": "已达到您的并发 GPU 上限 {limit}（已使用 {used}）",
    "queue.top_up": "等待充值：您的余额为 {balance} 元",
    "queue.no_price_cpu": "仅 CPU 的任务尚未定价：需要管理员设置价格",
    "queue.no_price_product": "{product} 尚未定价：需要管理员设置价格",
    "queue.no_price_gpu": "还没有任何 GPU 型号定价：需要管理员设置价格",
    "queue.requeued": "重新排队：{why}",
    "job.shape": "{nodes} 个节点 × 每节点 {gpus} 块 GPU",
    "job.placed": "CPod {cpod}，节点 {names}",
    "job.by": "操作人 {who}",
    "job.cancelled_by": "由 {who} 取消",
    "job.cancelled": "已取消",
    "job.cancelled_while_lost": "在其 CPod 失联期间取消",
    "job.exit_code": "退出码 {code}",
    "job.lost_times": "已丢失 {times} 次；最近一次：{why}",
    "job.not_resumed": "agent 无法恢复此任务",
    "job.cpod_offline": "CPod {cpod} 已离线",
    "job.cpod_revoked": "CPod {cpod} 已被吊销",
    "job.balance_exhausted": "余额已用完",
    "job.stopping": "正在停止：先发送 SIGTERM，再给 {seconds} 秒保存工作",
    "job.no_adapter": "训练程序结束时没有写出 {path}，未登记模型",
    "agent.command_not_found": "找不到命令：{program}",
    "agent.command_not_found_but": "找不到命令：{program}（PATH 中有：{found}）",
    "agent.max_runtime": "超过最长运行时间（{seconds} 秒）",
    "ft.validating_training": "校验训练文件：{file}",
    "ft.validating_validation": "校验验证文件：{file}",
    "ft.files_validated": "文件校验通过",
    "ft.created": "已创建微调：{id}",
    "ft.queued": "微调已进入队列",
    "ft.started": "微调已开始",
    "ft.started_on": "微调已开始，设备 {device}",
    "ft.step": "第 {step}/{total} 步：训练中",
    "ft.step_loss": "第 {step}/{total} 步：训练损失 {loss}",
    "ft.step_eval": "第 {step}/{total} 步：训练中，验证损失 {eval}",
    "ft.step_loss_eval": "第 {step}/{total} 步：训练损失 {loss}，验证损失 {eval}",
    "ft.tokens_training": "训练文件 {file}：{examples} 个样本，{model} 的分词器切出 {tokens} 个 token（其中 {trained} 个参与训练）",
    "ft.tokens_validation": "验证文件 {file}：{examples} 个样本，{model} 的分词器切出 {tokens} 个 token（其中 {trained} 个参与训练）",
    "ft.dropped": "文件 {file} 有 {n} 个样本被丢弃：max_seq_len 之内没有 assistant token",
    "ft.checkpoint": "已保存第 {step} 步的检查点",
    "ft.resumed": "从第 {step} 步的检查点继续（第 {attempt} 次尝试）",
    "ft.done": "训练完成，正在保存适配器",
    "ft.succeeded": "微调成功完成",
    "ft.cancelled": "微调已取消：{why}",
    "ft.failed": "微调失败：{why}",
    "ft.no_reason": "未说明原因",
    "ft.requeued_resume": "第 {attempt} 次尝试丢失（{why}）；已重新排队，将从第 {step} 步的检查点继续",
    "ft.requeued_fresh": "第 {attempt} 次尝试丢失（{why}）；已重新排队，将从头开始",
}

_BY_LANGUAGE = {"zh": ZH, "en": ENGLISH}


def reason_text(lang: str, reason: Reason | None) -> str:
    """A reason or an event in the console's language (Chinese where the language is unknown)."""
    if reason is None:
        return ""
    return render(reason, _BY_LANGUAGE.get(lang, ZH).get)
