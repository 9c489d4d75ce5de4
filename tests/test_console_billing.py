"""Money in the console over HTTP: an admin's prices, top-ups and payouts (errors in place, nothing
changed on error), a user's balance, statement and job cost, a provider's earnings, the low-balance
banner, and the submit form's prices and estimate. Usage is rated by the real metering pass.

A priced job runs through the agent protocol; its attempt is then given an exact duration (90.5 s on
2 GPUs at 7.20/GPU-hour, the issue's example: 0.362 CNY, 10 % fee) so that the pages' amounts can be
checked to the micro-yuan."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from sxwl.cloud.context import CloudContext
from sxwl.cloud.db.models import CPod, Job, JobAttempt
from sxwl.cloud.db.money_models import LedgerTransaction
from sxwl.cloud.db.types import utcnow
from sxwl.cloud.services.money import earnings, ledger, metering
from sxwl.cloud.web import i18n, kit
from sxwl.cloud.web.i18n import MESSAGES
from sxwl.cloud.web.i18n.money import MONEY_MESSAGES
from sxwl.cloud.web.kit import LANG_COOKIE
from tests.support.agent import eventually
from tests.test_admin_api import make_admin
from tests.test_console_forms import csrf
from tests.test_console_jobs import PRODUCT, browser_user, field_error, online_cpod, submit_form, submitted_id

RUN_S = 90.5


def ctx_of(client: TestClient) -> CloudContext:
    ctx: CloudContext = client.app.state.ctx  # type: ignore[attr-defined]
    return ctx


@pytest.fixture
def client(make_client: Callable[..., TestClient]) -> TestClient:
    # Metering runs only when a test calls it: the background loop's first round finds nothing.
    return make_client(billing_enabled=True, metering_interval_s=3600)


def admin_browser(client: TestClient) -> TestClient:
    make_admin(client, "root@example.com")
    admin = TestClient(client.app)
    token = csrf(admin, "/login")
    response = admin.post(
        "/login",
        data={"csrf_token": token, "email": "root@example.com", "password": "admin password"},
        follow_redirects=False,
    )
    assert response.status_code == 303, response.text
    return admin


def post_form(browser: TestClient, page: str, action: str, **fields: str) -> Any:
    return browser.post(action, data={"csrf_token": csrf(browser, page), **fields}, follow_redirects=False)


def set_price(
    admin: TestClient, product: str = PRODUCT, price: str = "7.20", fee: str = "10", resource: str = "gpu"
) -> Any:
    return post_form(
        admin, "/admin/prices", "/admin/prices", resource=resource, product=product, price=price, fee=fee
    )


def top_up(admin: TestClient, user: str, amount: str, note: str = "") -> Any:
    return post_form(admin, "/admin/money", "/admin/money/top-up", user=user, amount=amount, note=note)


def payout(admin: TestClient, provider: str, amount: str, reference: str = "TX-1") -> Any:
    return post_form(
        admin, "/admin/money", "/admin/money/payout", provider=provider, amount=amount, reference=reference
    )


def ledger_transactions(client: TestClient) -> int:
    with ctx_of(client).db.session() as session:
        return len(session.scalars(select(LedgerTransaction)).all())


@dataclass
class Ran:
    admin: TestClient
    user: TestClient
    provider: TestClient
    job_id: str
    cpod_id: str
    cpod_name: str


def run_priced_job(client: TestClient, cpu: bool = False) -> Ran:
    """Prices, a top-up of 100 CNY and a 2-GPU job (``cpu``: a job on CPU cores alone, at 0.36 per
    core-hour and no fee) that ran exactly 90.5 s, rated by metering."""
    agent = online_cpod(client)
    admin = admin_browser(client)
    if cpu:
        assert set_price(admin, "", price="0.36", fee="0", resource="cpu").status_code == 303
    else:
        assert set_price(admin).status_code == 303
    user = browser_user(client)
    assert top_up(admin, "dev@example.com", "100", "welcome").status_code == 303
    gpus = ("", "0") if cpu else (PRODUCT, "2")
    resources = {"gpu_product": gpus[0], "gpus_per_node": gpus[1]}
    job_id = submitted_id(submit_form(user, **resources))
    attempt = eventually(
        lambda: client.get("/api/v1/agent/assignments?wait=1", headers=agent).json()["assignments"],
        what="the assignment",
    )[0]["attempt"]
    for state in ("running", "succeeded"):
        extra = {"exit_code": 0} if state == "succeeded" else {}
        response = client.post(
            f"/api/v1/agent/jobs/{job_id}/status",
            headers=agent,
            json={"attempt": attempt, "state": state, **extra},
        )
        assert response.status_code == 200, response.text
    ctx = ctx_of(client)
    with ctx.db.session() as session:
        placed = session.scalars(select(JobAttempt).where(JobAttempt.job_id == job_id)).one()
        assert placed.rated_us == 0 and placed.started_at is not None
        placed.finished_at = placed.started_at + timedelta(seconds=RUN_S)
        placed.proven_until = placed.finished_at
        end = placed.finished_at
        job = session.get(Job, job_id)
        assert job is not None
        job.finished_at = end  # so that the job's page tells the same duration
        cpod = session.get(CPod, placed.cpod_id)
        assert cpod is not None
        cpod_id, cpod_name = cpod.id, cpod.name
    metering.meter_once(ctx, now=end + timedelta(seconds=1))
    provider = TestClient(client.app)
    token = csrf(provider, "/login")
    provider.post(
        "/login",
        data={"csrf_token": token, "email": "farm@example.com", "password": "correct horse"},
        follow_redirects=False,
    )
    return Ran(admin, user, provider, job_id, cpod_id, cpod_name)


def text_of(page: str, element_id: str) -> str:
    match = re.search(rf'id="{element_id}"[^>]*>([^<]*)<', page)
    assert match, f"no #{element_id}"
    return match.group(1).strip()


# ---- prices -------------------------------------------------------------------------------------


def test_prices_empty_state_set_list_and_remove(client: TestClient) -> None:
    online_cpod(client)
    admin = admin_browser(client)
    page = admin.get("/admin/prices").text
    assert "还没有定价：请设置定价，任务才能被调度。" in page
    assert f"在线但未定价的 GPU 型号（其上的任务不会被调度）：{PRODUCT}" in page
    assert '<a href="/admin/prices" class="active">定价</a>' in page

    response = set_price(admin, price="7.2", fee="12.5")
    assert response.headers["location"] == "/admin/prices?notice=price_set"
    # CPU cores may be free.
    assert set_price(admin, "", price="0", fee="0", resource="cpu").status_code == 303
    page = admin.get("/admin/prices?notice=price_set").text
    assert "定价已保存。" in page and 'id="unpriced"' not in page
    row = re.search(rf'<tr data-product="{PRODUCT}">(.*?)</tr>', page, re.S)
    assert row and "¥7.20" in row.group(1) and "12.5%" in row.group(1) and "root@example.com" in row.group(1)
    assert '<tr data-product="cpu">' in page
    api = admin.get("/api/v1/admin/prices").json()
    assert {(p["product"], p["price_per_hour_yuan"], p["fee_percent"]) for p in api} == {
        (PRODUCT, "7.2", "12.5"),
        ("", "0", "0"),
    }

    removed = post_form(admin, "/admin/prices", "/admin/prices/remove", resource="gpu", product=PRODUCT)
    assert removed.headers["location"] == "/admin/prices?notice=price_removed"
    assert [p["product"] for p in admin.get("/api/v1/admin/prices").json()] == [""]
    again = post_form(admin, "/admin/prices", "/admin/prices/remove", resource="gpu", product=PRODUCT)
    assert again.status_code == 422 and "没有这个定价。" in again.text

    # Saved workspaces: a price per GiB-day, all the platform's whatever fee is typed.
    assert set_price(admin, "", price="0.02", fee="0", resource="storage").status_code == 303
    row = re.search(r'<tr data-product="storage">(.*?)</tr>', admin.get("/admin/prices").text, re.S)
    assert row and "已保存的工作区" in row.group(1) and "¥0.02" in row.group(1) and "100%" in row.group(1)
    assert {p["unit"] for p in admin.get("/api/v1/admin/prices").json()} == {"core-hour", "GiB-day"}
    removed = post_form(admin, "/admin/prices", "/admin/prices/remove", resource="storage", product="")
    assert removed.headers["location"] == "/admin/prices?notice=price_removed"


@pytest.mark.parametrize(
    ("fields", "field", "message"),
    [
        ({"price": "-1"}, "price", "不能为负数。"),
        ({"price": "abc"}, "price", "请输入金额（元），例如 7.20。"),
        ({"price": "1.0000001"}, "price", "最多 6 位小数。"),
        ({"price": "100001"}, "price", "金额过大（最多 100000）。"),
        ({"price": ""}, "price", "请输入金额（元），例如 7.20。"),
        ({"fee": "101"}, "fee", "请输入 0 到 100 之间的百分比，最多 2 位小数。"),
        ({"fee": "x"}, "fee", "请输入 0 到 100 之间的百分比，最多 2 位小数。"),
        ({"product": ""}, "product", "GPU 定价需要填写 GPU 型号。"),
    ],
)
def test_bad_prices_are_shown_in_place_and_change_nothing(
    client: TestClient, fields: dict[str, str], field: str, message: str
) -> None:
    admin = admin_browser(client)
    values = {"product": PRODUCT, "price": "7.20", "fee": "10"} | fields
    response = set_price(admin, **values)
    assert response.status_code == 422
    assert field_error(response.text, field) == message
    assert f'value="{values[field]}"' in response.text or values[field] == ""  # kept as typed
    assert admin.get("/api/v1/admin/prices").json() == []


def test_forms_need_csrf_and_the_admin_role(client: TestClient) -> None:
    admin = admin_browser(client)
    response = admin.post("/admin/prices", data={"product": PRODUCT, "price": "1", "fee": "1"})
    assert response.status_code == 403 and "页面已过期，请刷新后重试。" in response.text
    response = admin.post("/admin/money/top-up", data={"user": "x", "amount": "1"})
    assert response.status_code == 403 and "页面已过期" in response.text
    assert admin.get("/api/v1/admin/prices").json() == [] and ledger_transactions(client) == 0
    user = browser_user(client)
    for path in ("/admin/prices", "/admin/money"):
        assert user.get(path).status_code == 403
    assert user.get("/earnings").status_code == 403
    provider = browser_user(client, "farm2@example.com", "provider")
    assert provider.get("/billing").status_code == 403


# ---- top-ups and payouts ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "field", "message"),
    [
        ({"amount": "0"}, "amount", "必须大于 0。"),
        ({"amount": "-5"}, "amount", "不能为负数。"),
        ({"amount": "1000000000000"}, "amount", "金额过大（最多 100000000）。"),
        ({"amount": "1e3"}, "amount", "请输入金额（元），例如 7.20。"),
        ({"amount": "ten"}, "amount", "请输入金额（元），例如 7.20。"),
        ({"user": "nobody@example.com"}, "user", "没有这个算力用户（请填写邮箱或用户 ID）。"),
        ({"user": "farm2@example.com"}, "user", "算力源不运行任务，请为算力用户充值。"),
        ({"note": "x" * 501}, "note", "内容过长。"),
    ],
)
def test_bad_top_ups_are_shown_in_place(
    client: TestClient, fields: dict[str, str], field: str, message: str
) -> None:
    browser_user(client)
    browser_user(client, "farm2@example.com", "provider")
    admin = admin_browser(client)
    values = {"user": "dev@example.com", "amount": "10", "note": ""} | fields
    response = top_up(admin, **values)
    assert response.status_code == 422
    match = re.search(rf'<p class="field-error" id="top-up-e-{field}">([^<]*)</p>', response.text)
    assert match and match.group(1) == message
    assert ledger_transactions(client) == 0


def test_top_up_by_email_or_id_shows_on_the_users_billing(client: TestClient) -> None:
    user = browser_user(client)
    admin = admin_browser(client)
    page = user.get("/billing").text
    assert text_of(page, "balance") == "¥0.00"
    assert "余额为 ¥0.00：充值后才能运行任务，请联系管理员充值。" in page  # the banner
    assert "本月没有充值。" in page
    user_id = user.get("/api/v1/me").json()["id"]
    assert (
        top_up(admin, "DEV@example.com", "12.5", "first").headers["location"]
        == "/admin/money?notice=topped_up"
    )
    assert top_up(admin, user_id, "0.000001").status_code == 303
    page = user.get("/billing").text
    # One rule for every amount (protocol/money.py money_text): two places from a fen up, two
    # significant digits below it, so the tiny top-up does not read ¥0.00 beside the balance.
    assert text_of(page, "balance") == "¥12.50" and 'title="¥' not in page
    assert 'id="balance-warning"' not in page
    assert "¥12.50</td><td>first</td>" in page and "¥0.000001</td>" in page
    money = admin.get("/admin/money").text
    assert text_of(money, "revenue-top_ups") == "¥12.50"
    recent = re.search(r'<table class="table compact" id="recent">(.*?)</table>', money, re.S)
    assert recent and "dev@example.com" in recent.group(1) and "first" in recent.group(1)
    assert "<td>root@example.com</td>" in recent.group(1)  # who did it


def test_every_page_writes_amounts_by_the_one_rule() -> None:
    amounts = (12_500_001, 325_800, 5_000, 15_000, 331, -120_000)
    assert [kit.templates.env.filters["yuan"](m) for m in amounts] == [
        "12.50",
        "0.33",
        "0.0050",
        "0.02",
        "0.00033",
        "-0.12",
    ]


def test_a_month_that_is_not_one_is_shown_in_place(client: TestClient) -> None:
    user = browser_user(client)
    response = user.get("/billing?month=2026-13")
    assert response.status_code == 422
    assert field_error(response.text, "month") == "月份格式应为 YYYY-MM，例如 2026-12。"
    assert user.get("/billing?month=2020-01").status_code == 200


# ---- a priced job -------------------------------------------------------------------------------


def test_what_the_user_provider_and_admin_see_of_a_priced_job(client: TestClient) -> None:
    ran = run_priced_job(client)
    # 2 GPUs × 90.5 s × 7.20 per GPU-hour = 0.362; the provider earns 90 % (0.3258), the fee is 0.0362.
    billing = ran.user.get("/billing").text
    assert text_of(billing, "balance") == "¥99.64"
    assert text_of(billing, "statement-total") == "¥0.36"  # the CSV below is exact
    row = re.search(rf'<tr data-job="{ran.job_id}">(.*?)</tr>', billing, re.S)
    assert row and "181.0 GPU·秒" in row.group(1) and "¥7.20" in row.group(1) and "¥0.36" in row.group(1)
    assert ran.cpod_name != ran.cpod_id
    # What the user paid, on the CPod named: no provider's fee or net, no raw CPod id.
    assert f"<td>{ran.cpod_name}</td>" in row.group(1) and ran.cpod_id not in billing
    assert "0.0362" not in billing and "0.3258" not in billing and "平台费" not in billing
    assert "¥100.00</td><td>welcome</td>" in billing
    month = re.search(r'name="month" value="(\d{4}-\d{2})"', billing)
    assert month
    assert f'href="/api/v1/billing/statement?month={month.group(1)}&amp;format=csv"' in billing
    csv = ran.user.get(f"/api/v1/billing/statement?month={month.group(1)}&format=csv")
    assert csv.status_code == 200 and "0.362000" in csv.text  # the link works with the cookie
    job = ran.user.get(f"/jobs/{ran.job_id}").text
    assert text_of(job, "job-cost-amount") == "¥0.36" and 'id="job-cost-rate"' not in job
    assert "总费用" in job and "目前费用" not in job  # it has finished: no "so far"

    earned = ran.provider.get("/earnings").text
    for card in ("earned-month", "earned-today", "earned-pending"):
        assert text_of(earned, card) == "¥0.33"
    assert text_of(earned, "earned-available") == "¥0.00"
    assert text_of(earned, "month-fee") == "0.04" and text_of(earned, "sold-hours") == "0.050"
    # The provider's own page keeps the split: what users paid, the fee, what they earn.
    product = re.search(rf'<tr data-key="{PRODUCT}">(.*?)</tr>', earned, re.S)
    assert product and "¥0.36" in product.group(1) and "¥0.04" in product.group(1)
    by_cpod = re.search(r'<table class="table compact nowrap" id="by-cpod">(.*?)</table>', earned, re.S)
    assert by_cpod and "¥0.33" in by_cpod.group(1)
    compute = ran.provider.get("/compute").text
    assert text_of(compute, "earned-month") == "¥0.33" and 'href="/earnings"' in compute

    # Held earnings become available; a payout above them is refused in place, one within is recorded.
    earnings.release_once(ctx_of(client), now=utcnow() + timedelta(days=30))
    before = ledger_transactions(client)
    refused = payout(ran.admin, "farm@example.com", "1")
    assert refused.status_code == 422
    match = re.search(r'<p class="field-error" id="payout-e-amount">([^<]*)</p>', refused.text)
    assert match and match.group(1) == "超过该算力源可提现的 ¥0.33。"
    assert 'value="TX-1"' in refused.text and ledger_transactions(client) == before
    assert payout(ran.admin, "farm@example.com", "0.3").headers["location"] == "/admin/money?notice=paid_out"
    earned = ran.provider.get("/earnings").text
    assert text_of(earned, "earned-available") == "¥0.03" and text_of(earned, "paid-out") == "0.30"
    money = ran.admin.get("/admin/money").text
    assert text_of(money, "revenue-fees") == "¥0.04"
    assert text_of(money, "revenue-payouts") == "¥0.30"
    assert text_of(money, "revenue-user_cash") == "¥99.64"
    with ctx_of(client).db.session() as session:
        assert ledger.check(session).ok


def test_cpu_work_reads_in_core_seconds_on_the_statement_and_the_earnings(client: TestClient) -> None:
    ran = run_priced_job(client, cpu=True)
    billing = ran.user.get("/billing").text
    row = re.search(rf'<tr data-job="{ran.job_id}">(.*?)</tr>', billing, re.S)
    assert row and "GPU" not in row.group(1), row
    assert "<td>CPU</td>" in row.group(1) and "90.5 核·秒" in row.group(1)
    earned = ran.provider.get("/earnings").text
    for table, usage in (
        ("earning-lines", "90.5 核·秒"),
        ("by-cpod", "0.025 核·小时"),
        ("by-product", "0.025 核·小时"),
    ):
        body = re.search(rf'id="{table}">.*?<tbody>(.*?)</tbody>', earned, re.S)
        assert body and usage in body.group(1) and "GPU" not in body.group(1), (table, body)
    ran.user.cookies.set(LANG_COOKIE, "en")
    assert "90.5 core-seconds" in ran.user.get("/billing").text


def test_a_running_job_shows_its_cost_per_hour_and_the_low_balance_banner(client: TestClient) -> None:
    agent = online_cpod(client)
    admin = admin_browser(client)
    set_price(admin)
    user = browser_user(client)
    # 5 CNY covers the job's 30 minutes at 7.20 per GPU-hour, but not an hour of it once it runs.
    assert top_up(admin, "dev@example.com", "5").status_code == 303
    job_id = submitted_id(submit_form(user, gpu_product=PRODUCT, gpus_per_node="1", max_runtime_min="30"))
    assert 'id="balance-warning"' not in user.get("/jobs").text  # nothing burns yet
    attempt = eventually(
        lambda: client.get("/api/v1/agent/assignments?wait=1", headers=agent).json()["assignments"],
        what="the assignment",
    )[0]["attempt"]
    running = client.post(
        f"/api/v1/agent/jobs/{job_id}/status", headers=agent, json={"attempt": attempt, "state": "running"}
    )
    assert running.status_code == 200, running.text
    page = user.get(f"/jobs/{job_id}").text
    assert text_of(page, "job-cost-rate") == "运行中，¥7.20/小时"
    fragment = user.get(f"/jobs/{job_id}/fragment").text  # what the page refreshes itself with
    assert text_of(fragment, "job-cost-rate") == "运行中，¥7.20/小时" and 'id="job-cost-amount"' in fragment
    assert "balance-warning" not in fragment  # the banner is the page's, not the fragment's
    for path in ("/jobs", f"/jobs/{job_id}", "/billing"):
        banner = user.get(path).text
        assert "余额不足：¥5.00，按当前消耗（¥7.20/小时）不到一小时。" in banner, path
    billing = user.get("/billing").text
    assert text_of(billing, "burn") == "¥7.20/小时" and text_of(billing, "hours-left") == "0.7 小时"
    assert "1 个运行中的尝试" in billing


# ---- the submit form ----------------------------------------------------------------------------


def test_the_submit_form_shows_prices_and_an_estimate(client: TestClient) -> None:
    online_cpod(client)
    user = browser_user(client)
    form = user.get("/jobs/new").text
    assert "未定价" in form and text_of(form, "estimate") == "所选资源还没有定价，任务会排队等待定价。"
    admin = admin_browser(client)
    set_price(admin, price="7.20")
    form = user.get("/jobs/new").text
    assert f"{PRODUCT} · " in form and "¥7.20/GPU 小时</option>" in form
    assert text_of(form, "estimate") == "预计费用：¥7.20/小时，按秒计费直到任务结束（未设最长运行时间）"
    assert "data-prices=" in form and "7200000" in form
    token = csrf(user, "/jobs/new")
    shown = user.post(
        "/jobs/new",
        data={
            "csrf_token": token,
            "command": "",
            "gpu_product": PRODUCT,
            "gpus_per_node": "2",
            "nodes": "1",
            "max_runtime_min": "90",
        },
    ).text
    assert text_of(shown, "estimate") == "预计费用：最多 ¥21.60（¥14.40/小时 × 最长运行时间 90 分钟）"


def test_billing_off_shows_no_money(make_client: Callable[..., TestClient]) -> None:
    client = make_client()
    user = browser_user(client)
    assert user.get("/billing").status_code == 404
    page = user.get("/jobs/new").text
    assert 'id="estimate"' not in page and 'href="/billing"' not in page and "balance-warning" not in page


def test_money_texts_exist_in_both_languages_once() -> None:
    assert set(MONEY_MESSAGES["zh"]) == set(MONEY_MESSAGES["en"])
    assert set(MESSAGES["zh"]) == set(MESSAGES["en"])
    # No key is in two tables: the merged table has as many as all of them.
    assert sum(len(table["zh"]) for table in i18n.TABLES) == len(MESSAGES["zh"])


def test_english_pages(client: TestClient) -> None:
    user = browser_user(client)
    user.cookies.set("sxwl_lang", "en")
    page = user.get("/billing").text
    assert "Your balance is ¥0.00: top up to run jobs (ask an admin)." in page
    assert "No charges this month." in page and ">Billing</a>" in page
