"""微调 (fine-tuning) in the console over HTTP: the list's empty state, uploading a dataset (each
bad line shown with its number), the form (validated by the API's own FineTuneRequest, errors in
place, nothing created), a fine-tune's page with its progress, ETA, cost and loss chart once its
trainer's progress lines arrive through the agent API, the adapter's download, cancel, and words.

A priced fine-tune runs through the agent protocol by hand (tests/support/billing_api.py), its
progress lines appended to its log as the agent would, on the cloud's frozen clock."""

from __future__ import annotations

import html
import io
import json
import re
import struct
import tarfile
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from sxwl.cloud.context import CloudContext
from sxwl.cloud.db.finetune_models import DataFile, FineTune
from sxwl.cloud.db.models import Job
from sxwl.cloud.services.catalog import model_catalog
from sxwl.cloud.services.finetune.dataset_checks import JsonlChecker
from sxwl.cloud.web.finetune import chart as finetune_chart
from sxwl.cloud.web.finetune import view as finetune_view
from sxwl.cloud.web.i18n import MESSAGES, TABLES
from sxwl.cloud.web.i18n.finetune import FINETUNE_MESSAGES
from sxwl.cloud.web.jobs import view as jobs_view
from sxwl.protocol.finetune import ADAPTER_ARTIFACT, Progress, checkpoint_artifact, progress_line
from sxwl.protocol.reasons import Reason, english
from tests.conftest import login, register
from tests.support.agent import eventually
from tests.support.billing_api import BILLING, PRODUCT, Money
from tests.support.clock import TestClock
from tests.support.cpods import access_key, beat, gpu_node, register_cpod
from tests.support.threads import run_on_thread
from tests.test_console_billing import admin_browser
from tests.test_console_forms import csrf
from tests.test_console_jobs import browser_user, field_error

MODEL = "tiny-llama"
GOOD_LINES = [
    {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]},
    {"messages": [{"role": "user", "content": "1+1?"}, {"role": "assistant", "content": "2"}]},
]
VALID_FORM = {
    "model": MODEL,
    "training_file": "",
    "validation_file": "",
    "n_epochs": "",
    "batch_size": "",
    "learning_rate_multiplier": "",
    "suffix": "",
    "seed": "",
    "lora_rank": "8",
    "lora_alpha": "16",
    "gpu_product": "",
    "gpus": "0",
    "max_cost_yuan": "",
}


def ctx_of(client: TestClient) -> CloudContext:
    ctx: CloudContext = client.app.state.ctx  # type: ignore[attr-defined]
    return ctx


def model_archive() -> bytes:
    """The smallest model directory the catalogue takes: config.json, a tokenizer, safetensors."""
    header = json.dumps({"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}}).encode()
    files = {
        "config.json": json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}).encode(),
        "tokenizer.json": b"{}",
        "model.safetensors": struct.pack("<Q", len(header)) + header + b"\0" * 16,
    }
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def register_model(ctx: CloudContext, name: str = MODEL) -> None:
    """An admin's public base model, through the catalogue service (on a thread of its own: never
    asyncio.run on the test's)."""
    run_on_thread(model_catalog.register_public(ctx, name=name, archive=io.BytesIO(model_archive())))


def jsonl(*lines: Any) -> bytes:
    return b"".join(
        (line if isinstance(line, bytes) else json.dumps(line).encode()) + b"\n" for line in lines
    )


def upload(browser: TestClient, data: bytes, name: str = "train.jsonl") -> Any:
    token = csrf(browser, "/finetune/files")
    return browser.post(
        "/finetune/files",
        data={"csrf_token": token},
        files={"file": (name, data, "application/jsonl")},
        follow_redirects=False,
    )


def uploaded_id(response: Any) -> str:
    assert response.status_code == 303, response.text
    # No "#upload-result": the result is the page's first card, and an anchor scrolled it under the
    # sticky top bar.
    match = re.fullmatch(r"/finetune/files\?uploaded=(file-[0-9a-f]+)", response.headers["location"])
    assert match, response.headers["location"]
    return match.group(1)


def create_form(browser: TestClient, **fields: str) -> Any:
    token = csrf(browser, "/finetune/new")
    return browser.post(
        "/finetune/new", data={"csrf_token": token, **(VALID_FORM | fields)}, follow_redirects=False
    )


def created_id(response: Any) -> str:
    assert response.status_code == 303, response.text
    match = re.fullmatch(r"/finetune/(ftjob-[0-9a-f]+)\?created=1", response.headers["location"])
    assert match, response.headers["location"]
    return match.group(1)


def fine_tune_count(client: TestClient) -> int:
    with ctx_of(client).db.session() as session:
        return session.scalar(select(func.count()).select_from(FineTune)) or 0


def job_of(client: TestClient, fine_tune_id: str) -> str:
    with ctx_of(client).db.session() as session:
        fine_tune = session.get(FineTune, fine_tune_id)
        assert fine_tune is not None
        return fine_tune.job_id


def signed_in(client: TestClient, email: str, password: str = "correct horse") -> TestClient:
    browser = TestClient(client.app)
    token = csrf(browser, "/login")
    response = browser.post(
        "/login", data={"csrf_token": token, "email": email, "password": password}, follow_redirects=False
    )
    assert response.status_code == 303, response.text
    return browser


# ---- the list and its empty state -----------------------------------------------------------


def test_nav_and_the_empty_list_tell_the_next_step(client: TestClient) -> None:
    browser = browser_user(client)
    page = browser.get("/finetune")
    assert page.status_code == 200
    assert '<a href="/finetune" class="active">微调</a>' in page.text
    assert "还没有微调任务" in page.text and 'id="ft-empty"' in page.text
    # No file yet: uploading is the step to take (the primary button).
    assert '<a class="btn btn-primary" href="/finetune/files" id="empty-upload">上传数据集</a>' in page.text
    assert 'href="/finetune/new" id="empty-new">新建微调</a>' in page.text
    assert 'data-live-src="/finetune/fragment"' in page.text
    fragment = browser.get("/finetune/fragment")
    assert fragment.status_code == 200 and 'data-shape="empty"' in fragment.text
    assert "<html" not in fragment.text


def test_providers_get_403_and_the_signed_out_go_to_sign_in(client: TestClient) -> None:
    provider = browser_user(client, "farm@example.com", role="provider")
    for path in ("/finetune", "/finetune/files", "/finetune/new"):
        assert provider.get(path).status_code == 403
    assert "/finetune" not in provider.get("/compute").text  # no nav link for them
    admin = admin_browser(client)  # admins fine-tune too, as they run jobs
    page = admin.get("/finetune")
    assert page.status_code == 200 and '<a href="/finetune" class="active">微调</a>' in page.text
    anonymous = TestClient(client.app)
    response = anonymous.get("/finetune/new", follow_redirects=False)
    assert response.status_code == 303 and response.headers["location"] == "/login?next=/finetune/new"
    assert anonymous.get("/finetune/fragment").status_code == 401


# ---- files ----------------------------------------------------------------------------------


def test_an_upload_with_bad_lines_shows_each_line_and_its_problem(client: TestClient) -> None:
    browser = browser_user(client)
    data = jsonl(
        GOOD_LINES[0],
        b"{not json",
        {"messages": [{"role": "user", "content": "no answer"}]},
        GOOD_LINES[1],
    )
    file_id = uploaded_id(upload(browser, data, "bad.jsonl"))
    page = browser.get(f"/finetune/files?uploaded={file_id}").text
    assert 'id="upload-result"' in page and 'data-status="error"' in page
    assert "“bad.jsonl”有问题" in page
    table = page[page.index('id="upload-problems"') :]
    table = table[: table.index("</table>")]
    lines = re.findall(
        r'<tr data-line="(\d+)"><td class="num nowrap">\d+</td><td class="problem-text">([^<]+)</td>', table
    )
    assert [line for line, _ in lines] == ["2", "3"]
    assert lines[0][1].startswith("不是合法的 JSON：") and "没有 assistant 消息" in lines[1][1]
    # The list keeps it, with its problems a click away, and offers no fine-tune on it.
    assert f'<tr data-key="{file_id}" data-status="error">' in page
    assert f'href="/finetune/new?training_file={file_id}"' not in page
    assert 'data-problems-of="' + file_id + '"' in page


def test_a_valid_upload_says_how_many_examples_and_offers_a_fine_tune(client: TestClient) -> None:
    browser = browser_user(client)
    file_id = uploaded_id(upload(browser, jsonl(*GOOD_LINES)))
    page = browser.get(f"/finetune/files?uploaded={file_id}").text
    assert "“train.jsonl”校验通过" in page and "共 2 个样本（对话）" in page
    assert f'href="/finetune/new?training_file={file_id}" id="train-uploaded"' in page
    assert re.search(
        rf'<tr data-key="{file_id}" data-status="processed">.*?<td class="num">2</td>', page, re.S
    )
    # Once a fine-tune has tokenized it, the file says how many tokens each base made of it.
    ctx: CloudContext = client.app.state.ctx  # type: ignore[attr-defined]
    with ctx.db.session() as session:
        stored = session.get(DataFile, file_id)
        assert stored is not None
        stored.token_counts = {"tiny-llama": {"examples": 2, "tokens": 900, "loss_tokens": 300, "dropped": 0}}
    page = browser.get("/finetune/files").text
    assert '<div class="muted small" data-tokens-of="tiny-llama">tiny-llama：900 个 token</div>' in page
    # The empty list now says the next step is the fine-tune itself.
    listing = browser.get("/finetune").text
    assert '<a class="btn btn-primary" href="/finetune/new" id="empty-new">' in listing


def test_an_upload_without_a_file_or_csrf_is_refused_in_place(client: TestClient) -> None:
    browser = browser_user(client)
    token = csrf(browser, "/finetune/files")
    response = browser.post("/finetune/files", data={"csrf_token": token}, files={"other": ("x", b"y")})
    assert response.status_code == 422 and "请选择要上传的 JSONL 文件。" in response.text
    forged = browser.post(
        "/finetune/files", data={"csrf_token": "forged"}, files={"file": ("t.jsonl", jsonl(*GOOD_LINES))}
    )
    assert forged.status_code == 403 and "页面已过期" in forged.text
    assert "还没有上传文件。" in browser.get("/finetune/files").text  # nothing was recorded


def test_uploads_past_the_default_body_limit_reach_the_files_limit(
    make_client: Callable[..., TestClient],
) -> None:
    client = make_client(file_max_bytes=3 * 1024 * 1024)
    browser = browser_user(client)
    line = {"prompt": "x" * 1000, "completion": "y"}
    big = jsonl(*[line] * 2000)  # about 2 MiB: over the console's default body limit of 1 MiB
    file_id = uploaded_id(upload(browser, big, "big.jsonl"))
    assert "共 2000 个样本" in browser.get(f"/finetune/files?uploaded={file_id}").text
    too_big = upload(browser, big + big, "bigger.jsonl")
    assert too_big.status_code == 413 and "文件太大：最大 3 MiB。" in too_big.text
    assert "bigger.jsonl" not in browser.get("/finetune/files").text  # nothing recorded


# ---- the form -------------------------------------------------------------------------------


def test_the_form_offers_the_catalogue_and_the_users_valid_files(client: TestClient) -> None:
    register_model(ctx_of(client))
    browser = browser_user(client)
    good = uploaded_id(upload(browser, jsonl(*GOOD_LINES), "good.jsonl"))
    bad = uploaded_id(upload(browser, jsonl(b"nope"), "bad.jsonl"))
    page = browser.get(f"/finetune/new?training_file={good}").text
    # The only model is chosen already, as is the file the link names.
    assert f'<option value="{MODEL}" selected>{MODEL} · 4 参数 · LlamaForCausalLM</option>' in page
    assert f'<option value="{good}" selected>good.jsonl · 2 个样本 · {good}</option>' in page
    assert bad not in page  # a file with errors is not offered
    assert "不使用验证文件" in page and "费用上限（元）" in page and "LoRA rank" in page


def test_the_forms_defaults_fit_the_online_cpods_and_the_users_last_choice(client: TestClient) -> None:
    """Submitted untouched, the form starts a fine-tune that can run: GPUs only where an online CPod
    that runs fine-tunes has one, the model of the user's latest fine-tune, their newest file."""
    ctx = ctx_of(client)
    register_model(ctx)
    browser = browser_user(client)
    older = uploaded_id(upload(browser, jsonl(*GOOD_LINES), "older.jsonl"))
    newest = uploaded_id(upload(browser, jsonl(*GOOD_LINES), "newest.jsonl"))

    def defaults() -> tuple[str, str, str, str]:
        page = browser.get("/finetune/new").text
        model = re.search(r'<option value="([^"]+)" selected>', page.split('id="f-model"')[1])
        train = re.search(r'<option value="([^"]+)" selected>', page.split('id="f-training_file"')[1])
        gpus = re.search(r'id="f-gpus" name="gpus" value="(\d*)"', page)
        hint = re.search(r'<p class="field-hint" id="h-gpus">([^<]*)</p>', page)
        assert model and train and gpus and hint, page
        return model.group(1), train.group(1), gpus.group(1), hint.group(1)

    # No CPod at all: on CPUs, and the form says why.
    assert defaults() == (
        MODEL,
        newest,
        "0",
        "在线运行微调的 CPod 都没有 GPU：填 0 用 CPU 训练（适合很小的模型）。",
    )
    # GPUs on a CPod that runs no fine-tunes (Kubernetes without a trainer image) change nothing.
    register(client, "owner@example.com", "provider")
    key = access_key(client, login(client, "owner@example.com"))
    k8s = register_cpod(client, key, cluster_uid="cluster-k8s-1", runtime="kubernetes")
    assert beat(client, k8s["cpod_token"], 1, [gpu_node("g1", count=8)]).status_code == 200
    assert defaults()[2] == "0"
    # A CPod that runs fine-tunes and has a GPU: one GPU.
    local = register_cpod(client, key, cluster_uid="cluster-local-1")
    assert beat(client, local["cpod_token"], 1, [gpu_node("g2", count=2)]).status_code == 200
    assert defaults()[2] == "1"
    # Another model, used last: the next form starts with it; what is typed or linked still wins.
    register_model(ctx, "other-model")
    assert defaults()[0] == MODEL  # the first of equal size
    created_id(create_form(browser, model="other-model", training_file=older))
    assert defaults()[0] == "other-model"
    linked = browser.get(f"/finetune/new?training_file={older}").text
    assert f'<option value="{older}" selected>' in linked


def test_form_errors_are_shown_in_place_and_nothing_is_created(client: TestClient) -> None:
    register_model(ctx_of(client))
    browser = browser_user(client)
    file_id = uploaded_id(upload(browser, jsonl(*GOOD_LINES)))
    response = create_form(
        browser,
        training_file=file_id,
        n_epochs="0",
        batch_size="x",
        learning_rate_multiplier="11",
        suffix="bad suffix!",
        lora_rank="0",
        seed="-1",
        gpus="99",
        max_cost_yuan="abc",
    )
    assert response.status_code == 422
    page = response.text
    assert field_error(page, "n_epochs") == "请输入 1 到 50 之间的整数，或留空（自动）。"
    assert field_error(page, "batch_size") == "请输入 1 到 256 之间的整数，或留空（自动）。"
    assert field_error(page, "learning_rate_multiplier") == "请输入大于 0、不超过 10.0 的数，或留空（自动）。"
    assert field_error(page, "suffix") == "只能包含字母、数字、. _ -，最多 40 个字符。"
    assert field_error(page, "lora_rank") == "请输入 1 到 256 之间的整数。"
    assert field_error(page, "seed") == "请输入 0 到 2147483647 之间的整数。"
    assert field_error(page, "gpus") == "请输入 0 到 64 之间的整数。"
    assert field_error(page, "max_cost_yuan").startswith("请输入大于 0")
    assert 'aria-invalid="true" aria-describedby="e-suffix"' in page
    assert 'value="bad suffix!"' in page and 'value="abc"' in page  # what was typed stays
    assert f'<option value="{file_id}" selected>' in page
    assert fine_tune_count(client) == 0

    missing = create_form(browser, model="", training_file="")
    assert missing.status_code == 422
    assert field_error(missing.text, "model") == "请选择基础模型。"
    assert field_error(missing.text, "training_file") == "请选择训练文件。"
    assert fine_tune_count(client) == 0


def test_the_services_refusals_are_shown_at_their_field(client: TestClient) -> None:
    register_model(ctx_of(client))
    browser = browser_user(client)
    bad = uploaded_id(upload(browser, jsonl(b"nope")))
    refused = create_form(browser, training_file=bad)
    assert refused.status_code == 422
    assert bad in field_error(refused.text, "training_file")
    unknown = create_form(browser, model="no-such-model", training_file=bad)
    assert unknown.status_code == 422 and "no-such-model" in field_error(unknown.text, "model")
    forged = browser.post("/finetune/new", data={"csrf_token": "forged", **VALID_FORM, "training_file": bad})
    assert forged.status_code == 403 and "页面已过期" in forged.text
    assert fine_tune_count(client) == 0


# ---- one fine-tune, with progress -----------------------------------------------------------


@pytest.fixture
def money(clock: TestClock, make_client: Callable[..., TestClient]) -> Money:
    """Billing on, A100s priced at 7.20 CNY an hour, a CPod driven by hand, the user topped up."""
    money = Money(make_client(**BILLING), clock)
    money.top_up("100")
    register_model(money.ctx)
    return money


def append_progress(money: Money, job_id: str, attempt: int, offset: int, *lines: Progress) -> int:
    data = "".join(progress_line(p) + "\n" for p in lines).encode()
    response = money.client.post(
        f"/api/v1/agent/jobs/{job_id}/logs?attempt={attempt}&offset={offset}",
        headers=money.agent,
        content=data,
    )
    assert response.status_code == 200, response.text
    return offset + len(data)


def running_fine_tune(money: Money, browser: TestClient) -> tuple[str, str, int]:
    file_id = uploaded_id(upload(browser, jsonl(*GOOD_LINES)))
    response = create_form(
        browser,
        training_file=file_id,
        suffix="support-bot",
        gpu_product=PRODUCT,
        gpus="1",
        n_epochs="2",
        max_cost_yuan="50",
    )
    fine_tune_id = created_id(response)
    job_id = job_of(money.client, fine_tune_id)
    attempt = money.take(job_id)
    money.status(job_id, attempt, "running")
    return fine_tune_id, job_id, attempt


def test_a_cap_below_the_estimate_or_unpriced_gpus_are_said_in_the_consoles_words(money: Money) -> None:
    browser = signed_in(money.client, "dev@example.com")
    file_id = uploaded_id(upload(browser, jsonl(*GOOD_LINES)))
    fields = {"training_file": file_id, "gpus": "1", "n_epochs": "2", "max_cost_yuan": "0.000001"}
    over = create_form(browser, gpu_product=PRODUCT, **fields)
    assert over.status_code == 422
    said = field_error(over.text, "max_cost_yuan")
    assert said.startswith("预计费用 ¥") and "高于上限 ¥0.000001" in said and "micro-yuan" not in said
    unpriced = create_form(browser, gpu_product="NVIDIA-H100-unpriced", **fields)
    assert (
        field_error(unpriced.text, "max_cost_yuan")
        == "这种 GPU 还没有定价，无法估算费用；请去掉上限或换一种 GPU。"
    )


def test_a_fine_tunes_page_follows_its_progress_eta_cost_and_loss(money: Money) -> None:
    browser = signed_in(money.client, "dev@example.com")
    fine_tune_id, job_id, attempt = running_fine_tune(money, browser)
    page = browser.get(f"/finetune/{fine_tune_id}?created=1").text
    # Already running: the banner does not say it waits for GPUs, and app.js removes it when the
    # status it was shown for changes.
    banner = re.search(r'<div class="alert alert-success" role="status" id="ft-notice" ([^>]*)>([^<]*)', page)
    assert banner and banner.group(2) == "微调已创建。"
    assert 'data-while-state="running"' in banner.group(1)
    assert "正在排队等待 GPU" not in page
    assert 'data-status="running"' in page and "等待训练开始…" in page
    assert 'id="loss-chart-empty"' in page and 'id="cancel-ft"' in page

    offset = append_progress(
        money,
        job_id,
        attempt,
        0,
        Progress(kind="started"),
        Progress(kind="metrics", step=10, total_steps=100, loss=2.0, elapsed_s=12.0),
    )
    money.tick(10)
    append_progress(
        money,
        job_id,
        attempt,
        offset,
        Progress(kind="metrics", step=20, total_steps=100, loss=1.5, elapsed_s=22.0),
        Progress(kind="eval", step=20, total_steps=100, loss=1.5, eval_loss=1.6, elapsed_s=22.0),
    )
    page = browser.get(f"/finetune/{fine_tune_id}").text
    assert '<progress class="ft-bar ft-bar-lg" value="20" max="100"' in page
    assert "第 20 / 100 步" in page and '<strong id="ft-percent">20%</strong>' in page
    # 10 steps in 10 s by the trainer's clock: 80 steps left at one a second.
    assert re.search(r'<dd id="ft-eta">约 1 分 20 秒', page)
    assert '<dd id="ft-cost">¥0.02</dd>' in page  # 10 s of one A100 at 7.20 an hour
    expected = re.search(r'<dd id="ft-expected">¥([0-9.]+)', page)
    assert expected and float(expected.group(1)) > 0.02
    assert "上限 ¥50.00" in page
    assert '<dd id="ft-loss">1.5000</dd>' in page and '<dd id="ft-eval-loss">1.6000</dd>' in page
    assert 'id="loss-chart"' in page and 'id="train-line" d="M' in page and '<circle class="dot-eval"' in page
    assert "第 20/100 步：训练损失 1.5000，验证损失 1.6000" in page
    assert "微调已开始" in page
    # The fragment the page refreshes with says the same, alone.
    fragment = browser.get(f"/finetune/{fine_tune_id}/fragment").text
    assert "<html" not in fragment and 'value="20" max="100"' in fragment and 'id="train-line"' in fragment
    # The list shows it too.
    listing = browser.get("/finetune").text
    assert f'<tr data-key="{fine_tune_id}"' in listing and ">support-bot</a>" in listing
    assert 'value="20" max="100"' in listing and "第 20 / 100 步 · 20%" in listing
    assert "约 1 分 20 秒" in listing and "¥0.02" in listing


def test_a_queued_fine_tune_says_what_it_waits_for_on_its_page_and_in_the_list(client: TestClient) -> None:
    register_model(ctx_of(client))
    browser = browser_user(client)
    file_id = uploaded_id(upload(browser, jsonl(*GOOD_LINES)))
    fine_tune_id = created_id(create_form(browser, training_file=file_id, gpus="2"))
    user = login(client, "dev@example.com")

    def waiting() -> str | None:
        reason = client.get(f"/v1/fine_tuning/jobs/{fine_tune_id}", headers=user).json()["reason"]
        return reason if reason and "scheduler" not in reason else None

    reason = eventually(waiting, what="the scheduler's reason")  # no CPod at all
    for lang, label in (("zh", "排队原因："), ("en", "Waiting:")):
        browser.cookies.set("sxwl_lang", lang)
        with ctx_of(client).db.session() as session:
            kept = session.scalar(select(Job.reason).where(Job.id == job_of(client, fine_tune_id)))
        assert english(kept) == reason  # the API says in English what the row keeps as a code
        shown = html.escape(jobs_view.reason(lang, kept), quote=False)
        page = browser.get(f"/finetune/{fine_tune_id}").text
        said = re.search(r'<p class="job-reason" id="ft-reason" data-status="queued">(.*?)</p>', page, re.S)
        assert said and label in said.group(1) and shown in said.group(1), page
        listing = browser.get("/finetune").text
        assert f'<span class="muted small ft-reason">{shown}</span>' in listing


def test_a_succeeded_fine_tune_offers_its_adapter(money: Money) -> None:
    browser = signed_in(money.client, "dev@example.com")
    fine_tune_id, job_id, attempt = running_fine_tune(money, browser)
    offset = append_progress(
        money, job_id, attempt, 0, Progress(kind="metrics", step=2, total_steps=4, loss=0.9, eval_loss=1.1)
    )
    checkpoint = money.client.put(
        f"/api/v1/agent/jobs/{job_id}/artifacts/{checkpoint_artifact(2)}?attempt={attempt}",
        headers=money.agent,
        content=b"checkpoint tar",
    )
    assert checkpoint.status_code == 201, checkpoint.text
    running = browser.get(f"/finetune/{fine_tune_id}").text
    row = re.search(r'<tr data-step="2"[^>]*>(.*?)</tr>', running, re.S)
    assert row and "0.9000" in row.group(1) and "1.1000" in row.group(1)
    assert "已保存第 2 步的检查点" in running
    append_progress(money, job_id, attempt, offset, Progress(kind="done", step=4, total_steps=4, loss=0.5))
    put = money.client.put(
        f"/api/v1/agent/jobs/{job_id}/artifacts/{ADAPTER_ARTIFACT}?attempt={attempt}",
        headers=money.agent,
        content=b"adapter bytes",
    )
    assert put.status_code == 201, put.text
    money.tick(5)
    money.finish(job_id, attempt, "succeeded", exit_code=0)
    page = browser.get(f"/finetune/{fine_tune_id}").text
    name = f"ft:{MODEL}:support-bot:{fine_tune_id}"
    assert 'data-status="succeeded"' in page and ">已完成<" in page
    assert f'<code class="secret" id="adapter-name">{name}</code>' in page
    url = finetune_view.model_url(name)
    assert f'href="{url}" download id="adapter-download"' in page
    # Deployed from here as an endpoint: the Endpoints page's form, filled in with the adapter.
    assert f'href="/endpoints?model={quote(name)}" id="adapter-deploy"' in page
    assert 'id="cancel-ft"' not in page
    # One training loss: the one logged at the latest step, in the summary and the chart alike (not
    # the run's mean an older trainer's last line carries).
    assert '<dd id="ft-loss">0.9000</dd>' in page
    assert re.search(r'class="legend legend-train">[^<]*<b>0\.9000</b>', page)
    download = browser.get(url)
    assert download.status_code == 200 and download.content == b"adapter bytes"  # the cookie is enough
    assert "微调成功完成" in page


def test_cancel_needs_csrf_and_a_finished_one_shows_the_conflict(client: TestClient) -> None:
    register_model(ctx_of(client))
    browser = browser_user(client)
    file_id = uploaded_id(upload(browser, jsonl(*GOOD_LINES)))
    fine_tune_id = created_id(create_form(browser, training_file=file_id))
    forged = browser.post(f"/finetune/{fine_tune_id}/cancel", data={"csrf_token": "forged"})
    assert forged.status_code == 403 and "页面已过期" in forged.text
    token = csrf(browser, f"/finetune/{fine_tune_id}")
    response = browser.post(
        f"/finetune/{fine_tune_id}/cancel", data={"csrf_token": token}, follow_redirects=False
    )
    assert (
        response.status_code == 303
        and response.headers["location"] == f"/finetune/{fine_tune_id}?cancelled=1"
    )
    page = browser.get(response.headers["location"]).text
    assert 'data-status="cancelled"' in page and ">已取消<" in page and 'id="cancel-ft"' not in page
    again = browser.post(f"/finetune/{fine_tune_id}/cancel", data={"csrf_token": token})
    assert again.status_code == 409 and "微调已经结束（已取消），无法取消。" in again.text
    other = browser_user(client, "other@example.com")
    assert other.get(f"/finetune/{fine_tune_id}").status_code == 404  # another user's is not there


def test_the_pages_in_english(client: TestClient) -> None:
    register_model(ctx_of(client))
    browser = browser_user(client)
    browser.cookies.set("sxwl_lang", "en")
    assert "No fine-tunes yet" in browser.get("/finetune").text
    file_id = uploaded_id(upload(browser, jsonl(GOOD_LINES[0], b"[1]")))
    files = browser.get(f"/finetune/files?uploaded={file_id}").text
    assert "“train.jsonl” has problems" in files and '<th class="num">Line</th>' in files
    response = create_form(browser, training_file="", n_epochs="99")
    assert (
        field_error(response.text, "n_epochs")
        == "Enter a whole number from 1 to 50, or leave it blank (auto)."
    )
    assert field_error(response.text, "training_file") == "Choose a training file."
    assert '<a href="/finetune" class="active">Fine-tuning</a>' in response.text


# ---- words and the chart ----------------------------------------------------------------------


def test_every_fine_tuning_text_exists_in_both_languages_once() -> None:
    assert set(FINETUNE_MESSAGES["zh"]) == set(FINETUNE_MESSAGES["en"])
    assert set(MESSAGES["zh"]) == set(MESSAGES["en"])
    assert sum(len(table["en"]) for table in TABLES) == len(MESSAGES["en"])  # each key once
    for status in finetune_view.STATUSES:
        assert f"ft.status.{status}" in FINETUNE_MESSAGES["zh"]


def test_the_loss_chart_keeps_the_latest_report_of_a_step() -> None:
    # A resumed attempt reports steps 3 and 4 again: one line along the steps, the latest values.
    series = [(1, 3.0, None), (2, 2.5, None), (3, 2.4, None), (4, 2.2, 2.6), (3, 2.0, None), (4, 1.5, 1.8)]
    chart = finetune_chart.loss_chart(series, total_steps=10)
    assert chart.last_train == 1.5 and chart.last_eval == 1.8
    assert chart.train_path.count("L") == 3 and chart.train_path.startswith("M")
    xs = [float(part[1:].split(",")[0]) for part in chart.train_path.split()]
    assert xs == sorted(xs)  # along the steps, never back
    assert [t.label for t in chart.x_ticks] == ["0", "2", "4", "6", "8", "10"]
    assert chart.y_ticks[0].label == "1.5" and float(chart.y_ticks[-1].label) >= 3.0
    assert len(chart.eval_dots) == 1 and chart.eval_path == ""  # one point: a dot, no line
    assert finetune_chart.loss_chart([], total_steps=0).empty
    many = finetune_chart.loss_chart([(i, 1.0 / (i + 1), None) for i in range(2000)], total_steps=2000)
    assert many.train_path.count("L") + 1 == finetune_chart.CHART_POINTS


@pytest.mark.parametrize(
    ("said", "en", "zh"),
    [
        (Reason.of("ft.queued"), "Fine-tuning job queued", "微调已进入队列"),
        (Reason.of("ft.checkpoint", step=40), "Checkpoint at step 40 saved", "已保存第 40 步的检查点"),
        (
            Reason.of("ft.resumed", step=40, attempt=2),
            "Resumed from checkpoint at step 40 (attempt 2)",
            "从第 40 步的检查点继续（第 2 次尝试）",
        ),
        (
            Reason.of(
                "ft.tokens_training", file="file-1", examples=24, tokens=900, trained=300, model="tiny-llama"
            ),
            "Training file file-1: 24 examples, 900 tokens (300 trained) with tiny-llama's tokenizer",
            "训练文件 file-1：24 个样本，tiny-llama 的分词器切出 900 个 token（其中 300 个参与训练）",
        ),
        (
            Reason.of("ft.dropped", n=2, file="file-2"),
            "2 examples of file file-2 dropped: no assistant token within max_seq_len",
            "文件 file-2 有 2 个样本被丢弃：max_seq_len 之内没有 assistant token",
        ),
        (
            Reason.of("ft.step_eval", step=600, total=2000, loss=None, eval=1.23456),
            "Step 600/2000: training, validation loss=1.2346",
            "第 600/2000 步：训练中，验证损失 1.2346",
        ),
        (
            Reason.of(
                "ft.failed", why=Reason.of("agent.command_not_found_but", program="python", found="python3")
            ),
            "The job failed: command not found: python (on PATH: python3)",
            "微调失败：找不到命令：python（PATH 中有：python3）",
        ),
        # A row written before the codes: its words, as stored, in every language.
        (
            Reason.read("Step 600/2000: training loss=1.0000"),
            "Step 600/2000: training loss=1.0000",
            "Step 600/2000: training loss=1.0000",
        ),
    ],
)
def test_event_messages_in_both_languages(said: Reason, en: str, zh: str) -> None:
    assert english(said) == en
    assert finetune_view.event_text("zh", said) == zh
    assert finetune_view.event_text("en", said) == en


def test_every_problem_the_checker_finds_reads_in_chinese_on_the_console() -> None:
    def problem(line: bytes) -> Reason:
        checker = JsonlChecker(max_line_bytes=200)
        checker.feed(line + b"\n")
        (found,) = checker.finish().problems
        return found.said

    chat = b'{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}'
    lines = [
        b'{"messages": []}',
        b'{"messages": [1]}',
        b'{"messages": [{"content": "x"}]}',
        b'{"messages": [{"role": "robot", "content": "x"}]}',
        b'{"messages": [{"role": "user", "content": ""}]}',
        b'{"messages": [{"role": "user", "content": "no answer"}]}',
        b'{"prompt": "p"}',
        b'{"prompt": "", "completion": "c"}',
        b"x" * 300,
        b"\xff\xfe",
        b"{not json",
        b"[1, 2]",
        b'{"text": "neither format"}',
    ]
    messages = [problem(line) for line in lines]
    checker = JsonlChecker()
    checker.feed(chat + b'\n{"prompt": "p", "completion": "c"}\n')
    messages.append(checker.finish().problems[0].said)
    messages.append(JsonlChecker().finish().problems[0].said)  # an empty file
    for said in messages:
        message = str(english(said))
        zh = finetune_view.problem_text("zh", said)
        # What Python's JSON parser says stays as it said it, after the console's own words.
        words = zh.split("：", 1)[0] if message.startswith("not JSON: ") else zh
        assert zh != message and not re.search(r"[a-z]{3,} [a-z]{3,} [a-z]{3,}", words), (message, zh)
        assert finetune_view.problem_text("en", said) == message
