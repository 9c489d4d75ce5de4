"""A /v1 stream whose engine is slow to send even its response head (a long prompt), and a key's
tokens per minute counted from real answers (docs/endpoints.md, "Calling an endpoint" and "Keys"):
a real cloud and agent, the replica's engine the recording vLLM stand-in, whose `lazy…` endpoint
waits 3 s before its head (tests/support/fake_vllm.py). The cloud's comment interval is set below
that wait, so the client must get the SSE head and comment lines before any of the engine's bytes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.test_endpoints_vllm import GpuWorld

openai = pytest.importorskip("openai")
HI = [{"role": "user", "content": "hi"}]


@pytest.fixture
def lazy(tmp_path: Path) -> Iterator[GpuWorld]:
    w = GpuWorld(tmp_path, f"sqlite:///{tmp_path / 'sxwl.db'}", SXWL_STREAM_KEEPALIVE_S="0.5")
    try:
        endpoint = w.create(name="lazy")
        assert w.wait_endpoint(endpoint["id"], "ready", "failed")["state"] == "ready"
        yield w
    finally:
        w.close()


def test_a_stream_gets_its_head_and_comments_before_a_slow_engine_s_head(lazy: GpuWorld) -> None:
    body = {"model": "lazy", "messages": HI, "max_tokens": 2, "stream": True}
    with httpx.stream(
        "POST", f"{lazy.url}/v1/chat/completions", headers=lazy.user, json=body, timeout=60
    ) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in response.iter_lines() if line]
    first_data = next(i for i, line in enumerate(lines) if line.startswith("data:"))
    # The engine sent nothing for 3 s: comment lines came first, then its stream, whole.
    assert first_data >= 1 and all(line.startswith(":") for line in lines[:first_data]), lines
    assert lines[-1] == "data: [DONE]"
    assert [line for line in lines[first_data:] if line.startswith(":")] == []
    # A refusal that comes after the stream's head: an error event, which the client raises with
    # the engine's field at fault.
    with pytest.raises(openai.APIError) as refused:
        list(lazy.api.chat.completions.create(model="lazy", messages=HI, temperature=3, stream=True))
    assert refused.value.param == "temperature" and "temperature" in refused.value.message


def test_a_key_s_tokens_per_minute_count_what_its_answers_used(lazy: GpuWorld) -> None:
    made = httpx.post(f"{lazy.url}/api/v1/keys", headers=lazy.user, json={"name": "tpm", "tpm": 10})
    assert made.status_code == 201, made.text
    key = openai.OpenAI(api_key=made.json()["key"], base_url=f"{lazy.url}/v1", max_retries=0)
    # 7 prompt and 4 completion tokens: past the 10 a minute, so the next call waits.
    answer = key.chat.completions.create(model="lazy", messages=HI)
    assert answer.usage is not None and answer.usage.total_tokens == 11
    with pytest.raises(openai.RateLimitError) as over:
        key.chat.completions.create(model="lazy", messages=HI)
    assert over.value.code == "tpm_exceeded" and over.value.type == "rate_limit_error"
    assert 1 <= int(over.value.response.headers["retry-after"]) <= 60
    # The user's own token has no such limit.
    assert lazy.api.chat.completions.create(model="lazy", messages=HI).usage is not None
