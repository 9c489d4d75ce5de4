"""模型 (the Models page), deleting a dataset from the console, and English counts of one, through
the real application (tests/test_console_finetune_browser.py walks the same in a browser)."""

from __future__ import annotations

import re

from fastapi.testclient import TestClient

from sxwl.cloud.web.i18n import translate
from tests.test_console_finetune import GOOD_LINES, MODEL, ctx_of, jsonl, register_model, upload, uploaded_id
from tests.test_console_forms import csrf
from tests.test_console_jobs import browser_user


def test_the_models_page_says_the_next_step_when_there_is_nothing_yet(client: TestClient) -> None:
    browser = browser_user(client)
    page = browser.get("/models")
    assert page.status_code == 200
    assert 'href="/models"' in page.text  # in the nav
    assert 'id="adapters-empty"' in page.text and "下一步：上传一个数据集，然后新建微调" in page.text
    assert 'href="/finetune/files"' in page.text and 'href="/finetune/new"' in page.text
    assert 'id="base-models-empty"' in page.text
    browser.cookies.set("sxwl_lang", "en")
    english = browser.get("/models").text
    assert "No fine-tuned model yet. Next step: upload a dataset" in english
    # Providers run no fine-tunes: not their page.
    provider = browser_user(client, "farm@example.com", role="provider")
    assert provider.get("/models").status_code == 403


def test_the_models_page_lists_the_base_models_to_fine_tune(client: TestClient) -> None:
    register_model(ctx_of(client))
    page = browser_user(client).get("/models").text
    item = re.search(rf'<li class="model-item" data-model="{MODEL}">(.*?)</li>', page, re.S)
    assert item and "公共" in item.group(1)
    assert f'href="/finetune/new?model={MODEL}"' in item.group(1)


def test_a_dataset_is_deleted_from_the_console_with_its_csrf_token(client: TestClient) -> None:
    browser = browser_user(client)
    file_id = uploaded_id(upload(browser, jsonl(*GOOD_LINES), "gone.jsonl"))
    action = f"/finetune/files/{file_id}/delete"
    assert f'action="{action}"' in browser.get("/finetune/files").text
    # Without the form's token: refused in place, and the file stays.
    forged = browser.post(action, data={"csrf_token": "forged"}, follow_redirects=False)
    assert forged.status_code == 403 and 'id="files-error"' in forged.text
    assert browser.get(f"/v1/files/{file_id}").status_code == 200
    token = csrf(browser, "/finetune/files")
    done = browser.post(action, data={"csrf_token": token}, follow_redirects=False)
    assert done.status_code == 303 and done.headers["location"] == "/finetune/files?deleted=gone.jsonl"
    page = browser.get(done.headers["location"]).text
    assert "数据集“gone.jsonl”已删除。" in page and file_id not in page
    assert browser.get(f"/v1/files/{file_id}").status_code == 404
    # Someone else's, or one already gone: said in place, not a bare error page.
    again = browser.post(action, data={"csrf_token": token}, follow_redirects=False)
    assert again.status_code == 404 and 'id="files-error"' in again.text
    assert 'class="error-code"' not in again.text


def test_english_counts_of_one_are_singular() -> None:
    assert translate("en", "ft.field.examples", n=1) == "1 example"
    assert translate("en", "ft.field.examples", n=2) == "2 examples"
    assert translate("zh", "ft.field.examples", n=1) == "1 个样本"
    body = translate("en", "ft.files.result_ok_body", n=1, format="chat")
    assert body == "1 example (chat): ready to fine-tune on."
