"""Money in a real browser: the cloud served by uvicorn (in this process, so that the test can run
the metering pass), a priced job that ran exactly 90.5 s on 2 GPUs at 7.20/GPU-hour with a 10 % fee
(tests/test_console_billing.py drives it through the agent protocol), and what each role sees:
the user's balance, statement and job cost, the provider's earnings on 收益 and 算力详情, the admin's
prices and payouts with an error in place, and the submit form's estimate as it is typed.
Screenshots go to test-artifacts/screenshots/."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from playwright.sync_api import Browser, BrowserContext, Page, ViewportSize, expect

from sxwl.cloud.app import create_app
from sxwl.cloud.db.types import utcnow
from sxwl.cloud.services.money import earnings
from tests.support import cloud as cloud_support
from tests.support.browser import fits_width, new_context, register_in_form, screenshot, sign_in
from tests.support.served import Served
from tests.test_console_billing import Ran, ctx_of, run_priced_job
from tests.test_console_jobs import PRODUCT

pytestmark = pytest.mark.browser

PHONE = ViewportSize(width=390, height=844)
PASSWORD = "correct horse"  # what the form-registered accounts of tests/test_console_forms.py use


@dataclass(frozen=True)
class Cloud:
    url: str
    ran: Ran


@pytest.fixture(scope="module")
def cloud(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cloud]:
    root = tmp_path_factory.mktemp("billing-browser")
    # The CPod beats once, in run_priced_job; the forms offer only an online CPod's products, so it
    # must not turn "unknown" while the module's tests run (3 missed 10 s beats by default).
    settings = cloud_support.test_settings(
        root / "data",
        f"sqlite:///{root / 'sxwl.db'}",
        billing_enabled=True,
        metering_interval_s=3600,
        unknown_after_missed=100_000,
    )
    app = create_app(settings)
    with Served(app, settings) as served:
        # The same application in-process (its lifespan is the served one's): the test's requests and
        # the metering pass it runs see the same database as the browser.
        ran = run_priced_job(TestClient(app))
        earnings.release_once(ctx_of(ran.admin), now=utcnow() + timedelta(days=30))
        yield Cloud(served.url, ran)


@pytest.fixture
def context(browser: Browser, cloud: Cloud) -> Iterator[BrowserContext]:
    context = new_context(browser, cloud.url)
    try:
        yield context
    finally:
        context.close()


def signed_in(context: BrowserContext, email: str, password: str = PASSWORD) -> Page:
    page = context.new_page()
    sign_in(page, email, password)
    return page


def shot(page: Page, name: str) -> Path:
    assert fits_width(page, 1280), f"{name} scrolls sideways"
    return screenshot(page, name)


def test_the_provider_sees_its_earnings(context: BrowserContext, cloud: Cloud) -> None:
    page = signed_in(context, "farm@example.com")
    expect(page).to_have_url(re.compile(r"/compute$"))
    card = page.locator("#earnings-card")
    # Every amount by the one rule (protocol/money.py money_text): two places from a fen up.
    expect(card.locator("#earned-month")).to_have_text("¥0.33")
    expect(card.locator("#earned-available")).to_have_text("¥0.33")  # released after the hold
    shot(page, "billing-compute-earnings-card")
    page.get_by_role("navigation", name="main").get_by_role("link", name="收益").click()
    expect(page).to_have_url(re.compile(r"/earnings$"))
    expect(page.locator("#earned-today")).to_have_text("¥0.33")
    expect(page.locator("#earned-pending")).to_have_text("¥0.00")
    expect(page.locator("#month-fee")).to_have_text("0.04")
    expect(page.locator("#sold-hours")).to_have_text("0.050")
    product = page.locator(f'#by-product tr[data-key="{PRODUCT}"] td')
    # The provider's own page keeps the split: what users paid, the platform's fee, what it earns.
    expect(product).to_have_text([PRODUCT, "0.050 GPU·小时", "¥0.36", "¥0.04", "¥0.33"])
    expect(page.locator("#earning-lines tbody tr")).to_have_count(1)
    expect(page.locator("#earning-lines tbody tr td").nth(2)).to_have_text(cloud.ran.cpod_name)
    shot(page, "billing-earnings")


def test_the_user_sees_the_balance_statement_and_job_cost(context: BrowserContext, cloud: Cloud) -> None:
    page = signed_in(context, "dev@example.com")
    page.get_by_role("navigation", name="main").get_by_role("link", name="费用").click()
    expect(page).to_have_url(re.compile(r"/billing$"))
    expect(page.locator("#balance")).to_have_text("¥99.64")
    expect(page.locator("#statement-total")).to_have_text("¥0.36")
    row = page.locator(f'#statement tr[data-job="{cloud.ran.job_id}"] td')
    # What the user paid, on the CPod named: no provider's fee or net, no raw CPod id anywhere.
    expect(row).to_have_text(["tiny-lm", "1", cloud.ran.cpod_name, PRODUCT, "181.0 GPU·秒", "¥7.20", "¥0.36"])
    expect(page.locator("#statement th")).not_to_contain_text(["平台费"])
    assert cloud.ran.cpod_id not in page.content()
    expect(page.locator("#top-ups tbody tr")).to_have_text(re.compile(r"¥100\.00\s*welcome"))
    expect(page.locator("#balance-warning")).to_have_count(0)
    shot(page, "billing-user")
    page.locator(f'#statement tr[data-job="{cloud.ran.job_id}"] a').click()
    expect(page.locator("#job-cost-amount")).to_have_text("¥0.36")
    expect(page.locator("#job-cost")).to_contain_text("总费用")  # finished: not "so far"
    shot(page, "billing-job-cost")

    page.goto("/jobs/new")
    expect(page.locator("#estimate")).to_have_text(
        "预计费用：¥7.20/小时，按秒计费直到任务结束（未设最长运行时间）"
    )
    page.locator("#f-gpu_product").select_option(PRODUCT)
    page.locator("#f-gpus_per_node").fill("2")
    page.locator("#f-max_runtime_min").fill("90")
    at_most = "预计费用：最多 ¥21.60（¥14.40/小时 × 最长运行时间 90 分钟）"
    expect(page.locator("#estimate")).to_have_text(at_most)  # recomputed by app.js as it is typed
    expect(page.locator("#f-gpu_product option", has_text=PRODUCT)).to_contain_text("¥7.20/GPU 小时")
    shot(page, "billing-submit-estimate")


def test_a_job_beyond_the_balance_is_refused_in_place_keeping_the_form(
    browser: Browser, cloud: Cloud
) -> None:
    for name, viewport in (("desktop", ViewportSize(width=1280, height=800)), ("phone", PHONE)):
        context = new_context(browser, cloud.url, viewport=viewport)
        try:
            page = context.new_page()
            register_in_form(page, "user", f"broke-{name}@example.com")
            page.goto("/jobs/new")
            page.locator("#f-command").fill("python3 train.py --epochs 3")
            page.locator("#f-gpu_product").select_option(PRODUCT)
            page.locator("#f-gpus_per_node").fill("1")
            page.locator("#f-gpus_per_node").press("Enter")
            # Not a bare "402" page: the message above the form, the amount missing, where to top up.
            error = page.locator("#form-error")
            expect(error).to_contain_text("还差 ¥7.20")
            expect(error).to_contain_text("请联系管理员充值")
            expect(page.locator("#top-up-link")).to_have_attribute("href", "/billing")
            expect(page.locator("#f-command")).to_have_value("python3 train.py --epochs 3")
            expect(page.locator("#f-gpus_per_node")).to_have_value("1")
            assert fits_width(page, viewport["width"]), f"the refused form scrolls sideways ({name})"
            screenshot(page, f"job-form-no-balance-{name}")
        finally:
            context.close()


def test_the_admin_sees_prices_revenue_and_a_refused_payout(context: BrowserContext, cloud: Cloud) -> None:
    page = signed_in(context, "root@example.com", "admin password")
    page.goto("/admin/prices")
    expect(page.locator(f'#prices tr[data-product="{PRODUCT}"]')).to_contain_text("¥7.20")
    shot(page, "billing-admin-prices")
    page.get_by_role("navigation", name="main").get_by_role("link", name="充值与结算").click()
    expect(page.locator("#revenue-fees")).to_have_text("¥0.04")
    expect(page.locator("#revenue-user_cash")).to_have_text("¥99.64")
    page.locator("#payout-provider").fill("farm@example.com")
    page.locator("#payout-amount").fill("5")
    page.locator("#payout-reference").fill("BANK-42")
    page.locator("#payout-submit").click()
    expect(page.locator("#payout-e-amount")).to_have_text("超过该算力源可提现的 ¥0.33。")
    expect(page.locator("#payout-reference")).to_have_value("BANK-42")
    shot(page, "billing-admin-payout-refused")


def test_pages_fit_a_phone(browser: Browser, cloud: Cloud) -> None:
    context = new_context(browser, cloud.url, viewport=ViewportSize(width=390, height=844))
    try:
        page = context.new_page()
        sign_in(page, "farm@example.com", PASSWORD)
        page.goto("/earnings")
        expect(page.locator("#earned-month")).to_have_text("¥0.33")
        screenshot(page, "billing-earnings-phone")
        wide = page.evaluate(
            "[...document.querySelectorAll('body *')].filter(e => e.getBoundingClientRect().right > 391"
            " && !e.closest('.table-wrap')).map(e => e.tagName + '.' + e.className).slice(0, 8).join(' ')"
        )
        assert fits_width(page, 390), wide
    finally:
        context.close()
    context = new_context(browser, cloud.url, viewport=ViewportSize(width=390, height=844))
    try:
        page = context.new_page()
        sign_in(page, "dev@example.com", PASSWORD)
        page.goto("/billing")
        expect(page.locator("#balance")).to_have_text("¥99.64")
        screenshot(page, "billing-user-phone")
        assert fits_width(page, 390)
    finally:
        context.close()
