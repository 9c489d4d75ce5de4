"""Every form of the console meets its refusals in place: the 4xx its user can cause, by what they
type or by when they send it, comes back on the form's own page with the reason and what was typed,
never as a bare error page that loses the input. The forms are read out of the templates, so a
form added without a case here fails the walk."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
from fastapi.testclient import TestClient

from sxwl.cloud.web.i18n import translate
from sxwl.cloud.web.kit import HERE
from tests.support.billing_api import BILLING, PRODUCT, Money
from tests.support.clock import TestClock
from tests.test_console_finetune import jsonl, register_model, signed_in, upload, uploaded_id
from tests.test_console_forms import csrf

FORM = re.compile(r'<form\b[^>]*\bmethod="post"[^>]*\baction="([^"]+)"', re.S)
PASSWORD = "correct horse"


def zh(key: str, **values: object) -> str:
    return translate("zh", key, **values)


def form_actions() -> set[str]:
    """The action of every POST form in the console's templates, a variable part written ``{}``."""
    found = set()
    for template in (HERE / "templates").glob("*.html"):
        for action in FORM.findall(template.read_text()):
            found.add(re.sub(r"\{\{[^}]*\}\}", "{}", action))
    return found


def in_place(response: Any, action: str, status: int, *shown: str) -> str:
    """The form's own page, refused with ``status``, saying each of ``shown``."""
    page: str = response.text
    assert response.status_code == status, (response.status_code, page[:300])
    assert 'class="error-code"' not in page, "a bare error page"
    assert f'action="{action}"' in page, f"not the page of the form {action}"
    for text in shown:
        assert text in page, text
    return page


def post(browser: TestClient, page: str, action: str, **fields: str) -> Any:
    return browser.post(action, data={"csrf_token": csrf(browser, page), **fields}, follow_redirects=False)


class World(Money):
    """Billing on, a provider's CPod, a funded compute user (dev@) and one with nothing (broke@)."""

    def __init__(self, client: TestClient, clock: TestClock) -> None:
        super().__init__(client, clock)
        self.top_up("100")
        self.client.post(
            "/api/v1/auth/register", json={"email": "broke@example.com", "password": PASSWORD, "role": "user"}
        )
        register_model(self.ctx)

    def browser(self, email: str, password: str = PASSWORD) -> TestClient:
        return signed_in(self.client, email, password)


@pytest.fixture
def world(clock: TestClock, make_client: Callable[..., TestClient]) -> World:
    return World(make_client(**BILLING), clock)


# ---- the cases, one per form ------------------------------------------------------------------


def login(world: World) -> None:
    browser = TestClient(world.client.app)
    response = post(browser, "/login", "/login", email="dev@example.com", password="wrong password")
    in_place(response, "/login", 401, zh("error.bad_credentials"), 'value="dev@example.com"')


def register(world: World) -> None:
    browser = TestClient(world.client.app)
    fields = {"role": "user", "email": "dev@example.com", "password": PASSWORD, "name": "Kept Name"}
    response = post(browser, "/register?role=user", "/register", **fields)
    in_place(response, "/register", 409, 'value="dev@example.com"', 'value="Kept Name"')


def logout(world: World) -> None:
    # Its only refusal is a stale page's token: nothing was typed, and the page says why.
    browser = world.browser("dev@example.com")
    response = browser.post("/logout", data={"csrf_token": "stale"}, follow_redirects=False)
    assert response.status_code == 403 and zh("error.csrf") in response.text
    assert browser.get("/account").status_code == 200  # still signed in


def change_password(world: World) -> None:
    browser = world.browser("dev@example.com")
    fields = {"current_password": "not it", "new_password": "a new long password"}
    in_place(post(browser, "/account", "/account/password", **fields), "/account/password", 422)


def rename_cpod(world: World) -> None:
    browser = world.browser("owner@example.com")
    action = f"/compute/cpods/{world.cpod_id}/rename"
    typed = "n" * 300
    in_place(post(browser, "/compute", action, name=typed), action, 422, f'value="{typed}"')


def revoke_cpod(world: World) -> None:
    browser = world.browser("owner@example.com")
    browser.get("/compute")
    action = f"/compute/cpods/{world.cpod_id}/revoke"
    response = browser.post(action, data={"csrf_token": "stale"}, follow_redirects=False)
    in_place(response, action, 403, zh("error.csrf"))


def upload_file(world: World) -> None:
    browser = world.browser("dev@example.com")
    response = post(browser, "/finetune/files", "/finetune/files")
    in_place(response, "/finetune/files", 422, zh("ft.files.choose"))


def new_fine_tune(world: World) -> None:
    browser = world.browser("broke@example.com")
    file_id = uploaded_id(upload(browser, jsonl(*_lines())))
    fields = {
        "model": "tiny-llama",
        "training_file": file_id,
        "gpu_product": PRODUCT,
        "gpus": "1",
        "suffix": "kept-suffix",
        "lora_rank": "8",
        "lora_alpha": "16",
    }
    page = in_place(
        post(browser, "/finetune/new", "/finetune/new", **fields), "/finetune/new", 402, 'value="kept-suffix"'
    )
    _says_what_is_missing(page, "/billing")


def cancel_fine_tune(world: World) -> None:
    browser = world.browser("dev@example.com")
    file_id = uploaded_id(upload(browser, jsonl(*_lines())))
    made = world.client.post(
        "/v1/fine_tuning/jobs", headers=world.user, json={"model": "tiny-llama", "training_file": file_id}
    )
    assert made.status_code == 200, made.text
    fine_tune_id = made.json()["id"]
    world.client.post(f"/v1/fine_tuning/jobs/{fine_tune_id}/cancel", headers=world.user)
    action = f"/finetune/{fine_tune_id}/cancel"
    response = post(browser, f"/finetune/{fine_tune_id}", action)
    assert response.status_code == 409 and 'id="cancel-conflict"' in response.text
    assert (
        'class="error-code"' not in response.text and f'/finetune/{fine_tune_id}/fragment"' in response.text
    )


def delete_file(world: World) -> None:
    browser = world.browser("dev@example.com")
    file_id = uploaded_id(upload(browser, jsonl(*_lines()), "in-use.jsonl"))
    made = world.client.post(
        "/v1/fine_tuning/jobs", headers=world.user, json={"model": "tiny-llama", "training_file": file_id}
    )
    assert made.status_code == 200, made.text
    action = f"/finetune/files/{file_id}/delete"
    used = zh("ft.files.in_use", name="in-use.jsonl", fine_tune=made.json()["id"])
    in_place(post(browser, "/finetune/files", action), action, 409, used)


def new_job(world: World) -> None:
    command = "python3 train.py --kept"
    fields = {"command": command, "gpu_product": PRODUCT, "gpus_per_node": "1", "nodes": "1"}
    broke = world.browser("broke@example.com")
    page = in_place(post(broke, "/jobs/new", "/jobs/new", **fields), "/jobs/new", 402, command)
    _says_what_is_missing(page, "/billing")
    # An administrator short of funds is sent to the page where they top up.
    admin = world.browser("root@example.com", "admin password")
    page = in_place(post(admin, "/jobs/new", "/jobs/new", **fields), "/jobs/new", 402, command)
    _says_what_is_missing(page, "/admin/money")


def cancel_job(world: World) -> None:
    browser = world.browser("dev@example.com")
    # No CPod offers it: it stays queued, so the API's cancel ends it at once.
    job = world.submit(gpu_product="NO-SUCH-GPU", gpus_per_node=1)
    world.client.post(f"/api/v1/jobs/{job['id']}/cancel", headers=world.user)
    response = post(browser, f"/jobs/{job['id']}", f"/jobs/{job['id']}/cancel")
    assert response.status_code == 409 and 'id="cancel-conflict"' in response.text
    assert 'class="error-code"' not in response.text


def set_price(world: World) -> None:
    admin = world.browser("root@example.com", "admin password")
    fields = {"resource": "gpu", "product": PRODUCT, "price": "not a price", "fee": "10"}
    in_place(post(admin, "/admin/prices", "/admin/prices", **fields), "/admin/prices", 422, "not a price")


def remove_price(world: World) -> None:
    admin = world.browser("root@example.com", "admin password")
    response = post(admin, "/admin/prices", "/admin/prices/remove", resource="gpu", product="NO-SUCH-GPU")
    in_place(response, "/admin/prices/remove", 422, zh("money.error.no_price"))


def money_forms(world: World) -> None:
    admin = world.browser("root@example.com", "admin password")
    top_up = post(admin, "/admin/money", "/admin/money/top-up", user="nobody@example.com", amount="5")
    in_place(top_up, "/admin/money/top-up", 422, zh("money.error.no_user"), 'value="nobody@example.com"')
    payout = post(admin, "/admin/money", "/admin/money/payout", provider="owner@example.com", amount="5")
    in_place(payout, "/admin/money/payout", 422, "¥0.00")


def deploy_endpoint(world: World) -> None:
    broke = world.browser("broke@example.com")
    fields = {
        "model": "tiny-llama",
        "name": "kept-name",
        "gpus": "1",
        "gpu_product": PRODUCT,
        "replicas": "1",
    }
    in_place(
        post(broke, "/endpoints", "/endpoints/deploy", **fields),
        "/endpoints/deploy",
        402,
        'value="kept-name"',
    )


def delete_endpoint(world: World) -> None:
    body = {"name": "chat", "model": "tiny-llama", "gpus": 1, "gpu_product": PRODUCT}
    made = world.client.post("/api/v1/endpoints", headers=world.user, json=body)
    assert made.status_code == 201, made.text
    browser = world.browser("dev@example.com")
    browser.get("/endpoints")
    action = f"/endpoints/{made.json()['id']}/delete"
    response = browser.post(action, data={"csrf_token": "stale"}, follow_redirects=False)
    in_place(response, action, 403, zh("error.csrf"))


def create_key(world: World) -> None:
    browser = world.browser("dev@example.com")
    in_place(post(browser, "/endpoints", "/endpoints/keys", key_name="k" * 101), "/endpoints/keys", 422)


def revoke_key(world: World) -> None:
    made = world.client.post("/api/v1/keys", headers=world.user, json={"name": "script"}).json()
    browser = world.browser("dev@example.com")
    browser.get("/endpoints")
    action = f"/endpoints/keys/{made['id']}/revoke"
    response = browser.post(action, data={"csrf_token": "stale"}, follow_redirects=False)
    in_place(response, action, 403, zh("error.csrf"))


def change_key_limits(world: World) -> None:
    made = world.client.post("/api/v1/keys", headers=world.user, json={"name": "script"}).json()
    browser = world.browser("dev@example.com")
    action = f"/endpoints/keys/{made['id']}/limits"
    in_place(post(browser, "/endpoints", action, rpm="-1", tpm="", monthly_cap=""), action, 422, "限额未保存")
    after = world.client.get("/api/v1/keys", headers=world.user).json()
    listed = after["data"] if isinstance(after, dict) else after
    assert [k.get("rpm") for k in listed if k["id"] == made["id"]] == [None]  # nothing changed


def create_dev_env(world: World) -> None:
    browser = world.browser("dev@example.com")
    response = post(browser, "/dev-envs", "/dev-envs", name="kept-name", gpus="-1")
    in_place(response, "/dev-envs", 422, zh("dev.field_invalid"), 'value="kept-name"')
    for field in ("cpus", "memory_gib"):
        response = post(browser, "/dev-envs", "/dev-envs", name="kept-name", **{field: "0"})
        in_place(
            response,
            "/dev-envs",
            422,
            zh("dev.field_invalid"),
            'value="kept-name"',
            f'name="{field}" value="0"',
        )


def dev_env_actions(world: World) -> None:
    """Sent from a page left open too long (a stale CSRF token): refused on the environments' page.
    Pause and resume are offered only in the states that allow them, so their forms are checked by
    the page they live on; stop is offered to this queued environment, so by its own form."""
    made = world.client.post("/api/v1/dev-envs", headers=world.user, json={"name": "dev"})
    assert made.status_code == 201, made.text
    browser = world.browser("dev@example.com")
    browser.get("/dev-envs")
    for verb in ("pause", "resume", "stop"):
        action = f"/dev-envs/{made.json()['id']}/{verb}"
        response = browser.post(action, data={"csrf_token": "stale"}, follow_redirects=False)
        in_place(response, action if verb == "stop" else "/dev-envs", 403, zh("error.csrf"))


CASES: dict[str, Callable[[World], None]] = {
    "/login": login,
    "/register": register,
    "/logout": logout,
    "/account/password": change_password,
    "/compute/cpods/{}/rename": rename_cpod,
    "/compute/cpods/{}/revoke": revoke_cpod,
    "/finetune/files": upload_file,
    "/finetune/files/{}/delete": delete_file,
    "/finetune/new": new_fine_tune,
    "/finetune/{}/cancel": cancel_fine_tune,
    "/jobs/new": new_job,
    "/jobs/{}/cancel": cancel_job,
    "/admin/prices": set_price,
    "/admin/prices/remove": remove_price,
    "/admin/money/{}": money_forms,
    "/endpoints/deploy": deploy_endpoint,
    "/endpoints/{}/delete": delete_endpoint,
    "/endpoints/keys": create_key,
    "/endpoints/keys/{}/revoke": revoke_key,
    "/endpoints/keys/{}/limits": change_key_limits,
    "/dev-envs": create_dev_env,
    "/dev-envs/{}/pause": dev_env_actions,
    "/dev-envs/{}/resume": dev_env_actions,
    "/dev-envs/{}/stop": dev_env_actions,
}


def _lines() -> list[bytes]:
    chat = b'{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}'
    return [chat, chat]


def _says_what_is_missing(page: str, top_up: str) -> None:
    error = re.search(r'<div class="alert alert-error" role="alert" id="form-error">(.*?)</div>', page, re.S)
    assert error, "no message above the form"
    assert re.search(r"还差 ¥\d+\.\d{2}", error.group(1)), error.group(1)
    assert f'<a href="{top_up}" id="top-up-link">' in error.group(1)


def test_every_post_form_of_the_console_has_a_case() -> None:
    assert form_actions() == set(CASES)


@pytest.mark.parametrize("action", sorted(CASES))
def test_a_forms_refusal_is_said_in_place(world: World, action: str) -> None:
    CASES[action](world)
