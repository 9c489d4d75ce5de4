"""推理服务 (the Endpoints page) through the real application: the Deploy button of a model leads to
the form prefilled, a deploy and its refusals in zh-CN and English, delete, and an inference key
shown once and revoked, each form with its CSRF token."""

from __future__ import annotations

import re

from fastapi.testclient import TestClient

from tests.test_console_finetune import MODEL, ctx_of, register_model
from tests.test_console_forms import csrf
from tests.test_console_jobs import browser_user


def test_a_model_is_deployed_from_the_console_and_deleted(client: TestClient) -> None:
    register_model(ctx_of(client))
    browser = browser_user(client)
    models = browser.get("/models").text
    assert f'href="/endpoints?model={MODEL}"' in models
    page = browser.get(f"/endpoints?model={MODEL}")
    assert page.status_code == 200 and 'href="/endpoints"' in page.text  # in the nav
    assert 'id="endpoints-empty"' in page.text and f'value="{MODEL}"' in page.text
    token = csrf(browser, "/endpoints")
    form = {"csrf_token": token, "model": MODEL, "name": "chat", "gpus": "0", "replicas": "1"}
    forged = browser.post("/endpoints/deploy", data=form | {"csrf_token": "forged"}, follow_redirects=False)
    assert forged.status_code == 403
    # Said in place: the form's refusal in the deploy card, under the list it would have joined.
    assert forged.text.index('id="deploy-card"') < forged.text.index('id="form-error"')
    bad = browser.post("/endpoints/deploy", data=form | {"replicas": "99"}, follow_redirects=False)
    assert bad.status_code == 422 and 'id="e-replicas"' in bad.text
    unknown = browser.post("/endpoints/deploy", data=form | {"model": "nope"}, follow_redirects=False)
    assert unknown.status_code == 404 and 'id="e-model"' in unknown.text
    done = browser.post("/endpoints/deploy", data=form, follow_redirects=False)
    assert done.status_code == 303 and done.headers["location"] == "/endpoints"
    listed = browser.get("/endpoints").text
    row = re.search(r'<tr data-endpoint="chat">(.*?)</tr>', listed, re.S)
    assert row and ("等待调度" in row.group(1) or "部署中" in row.group(1)) and "0/1" in row.group(1)
    assert 'model="chat"' in listed  # the openai client's call, with the endpoint's name
    browser.cookies.set("sxwl_lang", "en")
    assert "Your endpoints" in browser.get("/endpoints").text
    endpoint_id = re.search(r"(ep-[0-9a-f]+)", row.group(1))
    assert endpoint_id
    gone = browser.post(
        f"/endpoints/{endpoint_id.group(1)}/delete", data={"csrf_token": token}, follow_redirects=False
    )
    assert gone.status_code == 303
    empty = browser.get("/endpoints").text
    assert 'id="endpoints-empty"' in empty and 'href="#deploy-card"' in empty  # the next step, as a button
    # Deleting one that is not there is refused over the list, not on the deploy form.
    again = browser.post("/endpoints/ep-00000000/delete", data={"csrf_token": token}, follow_redirects=False)
    assert again.status_code == 404
    assert again.text.index('id="list-error"') < again.text.index('id="deploy-card"')
    assert 'id="form-error"' not in again.text


def test_an_inference_key_is_shown_once_and_revoked_from_the_console(client: TestClient) -> None:
    browser = browser_user(client)
    token = csrf(browser, "/endpoints")
    made = browser.post("/endpoints/keys", data={"csrf_token": token, "key_name": "script"})
    assert made.status_code == 200
    secret = re.search(r'id="new-key">.*?<code class="mono">(sk-[^<]+)</code>', made.text, re.S)
    assert secret
    again = browser.get("/endpoints").text
    assert secret.group(1) not in again and "script" in again and "有效" in again
    key_id = re.search(r'data-key="(key-[0-9a-f]+)"', again)
    assert key_id
    revoked = browser.post(
        f"/endpoints/keys/{key_id.group(1)}/revoke", data={"csrf_token": token}, follow_redirects=False
    )
    assert revoked.status_code == 303 and "已吊销" in browser.get("/endpoints").text
    call = {"model": "x", "messages": [{"role": "user", "content": "hi"}]}
    refused = client.post(
        "/v1/chat/completions", headers={"Authorization": f"Bearer {secret.group(1)}"}, json=call
    )
    assert refused.status_code == 401


def test_a_key_s_limits_are_set_and_changed_from_the_console_and_bad_ones_named(client: TestClient) -> None:
    browser = browser_user(client)
    token = csrf(browser, "/endpoints")
    page = browser.get("/endpoints").text
    assert "每分钟 token 数" in page and "每月花费上限（元）" in page  # the form's fields, with hints
    form = {
        "csrf_token": token,
        "key_name": "capped",
        "key_rpm": "60",
        "key_tpm": "",
        "key_monthly_cap": "-1",
    }
    refused = browser.post("/endpoints/keys", data=form)
    assert refused.status_code == 422 and 'id="f-key_monthly_cap"' in refused.text
    assert 'aria-invalid="true" aria-describedby="e-key_monthly_cap"' in refused.text  # said under its field
    assert 'id="e-key_monthly_cap"' in refused.text and 'value="60"' in refused.text  # kept as typed
    assert "data-key=" not in refused.text  # nothing created
    made = browser.post("/endpoints/keys", data=form | {"key_monthly_cap": "12.5"})
    assert made.status_code == 200 and 'id="new-key"' in made.text
    row = re.search(r'<tr data-key="(key-[0-9a-f]+)">(.*?)</tr>', made.text, re.S)
    assert row and 'name="rpm" type="text" inputmode="decimal" value="60"' in row.group(2)
    assert "60 次请求/分钟" in row.group(2) and "token 数不限" in row.group(2)  # read without the form
    assert 'value="12.5"' in row.group(2) and "¥0.00" in row.group(2)
    key_id = row.group(1)
    url = f"/endpoints/keys/{key_id}/limits"
    bad = browser.post(url, data={"csrf_token": token, "rpm": "0", "tpm": "100", "monthly_cap": ""})
    assert bad.status_code == 422 and "rpm" in bad.text
    kept = re.search(rf'<tr data-key="{key_id}">(.*?)</tr>', browser.get("/endpoints").text, re.S)
    assert kept and 'name="rpm" type="text" inputmode="decimal" value="60"' in kept.group(1)  # unchanged
    changed = browser.post(
        url, data={"csrf_token": token, "rpm": "", "tpm": "5000", "monthly_cap": "3"}, follow_redirects=False
    )
    assert changed.status_code == 303
    browser.cookies.set("sxwl_lang", "en")
    row = re.search(rf'<tr data-key="{key_id}">(.*?)</tr>', browser.get("/endpoints").text, re.S)
    assert row and 'name="tpm" type="text" inputmode="decimal" value="5000"' in row.group(1)
    assert 'name="rpm" type="text" inputmode="decimal" value=""' in row.group(1)
    assert 'value="3"' in row.group(1)
    assert "any requests/min" in row.group(1) and "¥3 a month" in row.group(1)
    assert "Tokens/min" in row.group(1) and "Spent this month" in browser.get("/endpoints").text


def test_the_playground_chats_through_v1_with_the_console_session(client: TestClient) -> None:
    register_model(ctx_of(client))
    browser = browser_user(client)
    token = csrf(browser, "/endpoints")
    form = {"csrf_token": token, "model": MODEL, "name": "chat", "gpus": "0", "replicas": "1"}
    assert browser.post("/endpoints/deploy", data=form, follow_redirects=False).status_code == 303
    endpoint_id = re.search(r'href="/endpoints/(ep-[0-9a-f]+)/playground"', browser.get("/endpoints").text)
    assert endpoint_id
    page = browser.get(f"/endpoints/{endpoint_id.group(1)}/playground")
    assert page.status_code == 200
    assert f'data-model="chat" data-csrf="{token}"' in page.text and "/static/playground.js" in page.text
    assert browser.get("/static/playground.js").status_code == 200
    # The page's script calls /v1 with the session and its CSRF token: that reaches the endpoint
    # (not serving yet here: 503); without the token, a forged cross-site call is refused.
    call = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    reached = browser.post("/v1/chat/completions", json=call, headers={"x-csrf-token": token})
    assert reached.status_code == 503 and reached.headers["retry-after"] == "10"
    assert browser.post("/v1/chat/completions", json=call).status_code == 403
    # Another user's endpoint has no playground for them.
    other = browser_user(client, "other@example.com")
    assert other.get(f"/endpoints/{endpoint_id.group(1)}/playground").status_code == 404
