"""`sxwl endpoints` and `sxwl keys` against a served cloud with a real agent whose GPUs are
simulated and whose vLLM is the recording stand-in (tests/test_endpoints_vllm.py): deploy, follow,
read the engine's log, call it with a key, revoke the key, delete; bad flags are named."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.agent import eventually
from tests.test_cli import sxwl
from tests.test_endpoints_vllm import GpuWorld
from tests.test_finetune_system import MODEL
from tests.test_jobs_process import PRODUCT

openai = pytest.importorskip("openai")


@pytest.fixture
def gworld(tmp_path: Path) -> Iterator[GpuWorld]:
    w = GpuWorld(tmp_path, f"sqlite:///{tmp_path / 'sxwl.db'}")
    yield w
    w.close()


def test_the_cli_deploys_follows_and_deletes_an_endpoint_and_its_keys(
    gworld: GpuWorld, tmp_path: Path
) -> None:
    env = {**os.environ, "SXWL_CONFIG_DIR": str(tmp_path / "cfg"), "COLUMNS": "200"}

    def run(*args: str) -> tuple[int, str, str]:
        done = sxwl(*args, env=env)
        return done.returncode, done.stdout, done.stderr

    login = sxwl(
        "login", "--url", gworld.url, "--email", "dev@example.com", "--password-stdin",
        env=env, stdin="correct horse\n",
    )  # fmt: skip
    assert login.returncode == 0, login.stderr
    code, text, _ = run("endpoints", "list")
    assert code == 0 and "No endpoints" in text
    code, _, errors = run("endpoints", "create", "--model", MODEL, "--gpus", "-1")
    assert code == 2 and "--gpus" in errors
    code, text, errors = run("endpoints", "create", "--model", "no-such-model")
    assert code == 1 and "model" in errors
    code, text, errors = run(
        "endpoints", "create", "--model", MODEL, "--name", "chat", "--gpus", "1", "--gpu-product", PRODUCT
    )
    assert code == 0 and "chat" in text, errors

    def ready() -> str | None:
        code, text, _ = run("endpoints", "show", "chat")
        return text if code == 0 and "ready" in text and "1/1 ready" in text else None

    shown = eventually(ready, timeout=60, what="the endpoint ready")
    assert f"base_url={gworld.url}/v1 model=chat" in shown
    code, text, _ = run("endpoints", "list")
    assert "chat" in text and "ready" in text

    code, _, err = run("keys", "create", "--name", "bad", "--monthly-cap", "-3")
    assert code != 0 and "monthly_cap" in err
    code, _, err = run("keys", "create", "--name", "bad", "--tpm", "0")
    assert code != 0 and "--tpm" in err
    code, secret, _ = run(
        "keys", "create", "--name", "script", "--rpm", "60", "--tpm", "100000", "--monthly-cap", "50"
    )
    secret = secret.strip().splitlines()[-1]
    assert code == 0 and secret.startswith("sk-")
    keyed = openai.OpenAI(api_key=secret, base_url=f"{gworld.url}/v1", max_retries=0)
    answer = keyed.chat.completions.create(model="chat", messages=[{"role": "user", "content": "hi"}])
    assert answer.choices[0].message.content == "fake vllm says hi"
    code, text, _ = run("keys", "list")
    assert code == 0 and "script" in text and secret not in text and "active" in text
    assert "bad" not in text and "100000" in text and "¥50" in text
    key_id = next(word for word in text.split() if word.startswith("key-"))
    code, text, _ = run("keys", "limits", key_id, "--tpm", "200000", "--lift", "monthly_cap")
    assert code == 0 and "rpm 60, tpm 200000, monthly cap -" in text
    code, _, err = run("keys", "limits", key_id, "--monthly-cap", "lots")
    assert code != 0 and "monthly_cap" in err
    code, _, err = run("keys", "limits", key_id)
    assert code != 0 and "--lift" in err
    code, text, _ = run("endpoints", "show", "chat")
    assert f"{key_id}: 1 requests" in text

    code, text, _ = run("endpoints", "logs", "chat")
    assert code == 0 and "::sxwl-engine:: starting the engine: vllm serve" in text
    code, text, _ = run("keys", "revoke", key_id)
    assert code == 0
    with pytest.raises(openai.AuthenticationError):
        keyed.chat.completions.create(model="chat", messages=[{"role": "user", "content": "hi"}])
    code, text, _ = run("endpoints", "delete", "chat")
    assert code == 0 and "stopped" in text
    (replica,) = gworld.wait_endpoint(text.split()[2].rstrip(":"), "stopped")["replica_jobs"]
    gworld.wait_state(replica["job_id"], "cancelled", timeout=60)
