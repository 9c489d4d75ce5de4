"""`sxwl files`, `sxwl models` and `sxwl finetune` against a served cloud with a real agent: a dataset
with mistakes is shown line by line, a bad flag is named, and a fine-tune of the tiny Llama is
created, followed to its end and its adapter downloaded."""

from __future__ import annotations

import json
import os
import re
import tarfile
from pathlib import Path

import httpx
import pytest

from tests.support.agent import eventually
from tests.test_cli import sxwl
from tests.test_finetune_system import MODEL, FineTuneWorld

pytest.importorskip("peft", reason="fine-tunes need the training extra: pip install -e '.[train]'")


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_the_cli_uploads_checks_fine_tunes_and_downloads(tmp_path: Path, db_url: str) -> None:
    world = FineTuneWorld(tmp_path, db_url)
    try:
        env = {**os.environ, "SXWL_CONFIG_DIR": str(tmp_path / "cfg"), "COLUMNS": "200"}

        def run(*args: str) -> tuple[int, str]:
            done = sxwl(*args, env=env)
            return done.returncode, done.stdout + done.stderr

        login = sxwl(
            "login", "--url", world.url, "--email", "dev@example.com", "--password-stdin",
            env=env, stdin="correct horse\n",
        )  # fmt: skip
        assert login.returncode == 0, login.stderr

        code, text = run("finetune", "list")
        assert code == 0 and "No fine-tunes yet" in text

        broken = tmp_path / "broken.jsonl"
        good = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
        no_answer = {"messages": [{"role": "user", "content": "hi"}]}
        broken.write_text(json.dumps(good) + "\nnot json\n" + json.dumps(no_answer) + "\n")
        code, text = run("files", "upload", str(broken))
        assert code == 3 and "error" in text  # the upload of a file with errors fails
        assert re.search(r"line 2: .*JSON", text) and re.search(r"line 3: .*assistant", text), text

        from_sample = world.dataset(12)  # through the openai client, like a script would
        code, text = run("files", "list")
        assert code == 0 and from_sample in text and "broken.jsonl" in text

        code, text = run("models", "list")
        assert code == 0 and MODEL in text and "LlamaForCausalLM" in text

        code, text = run(
            "finetune", "create", "--model", MODEL, "--training-file", from_sample, "--epochs", "0"
        )
        assert code == 2 and "--epochs" in text
        code, text = run("finetune", "create", "--model", "nope", "--training-file", from_sample)
        assert code == 1 and "nope" in text

        # With no CPod yet, `show` says what the fine-tune waits for.
        code, text = run(
            "finetune", "create", "--model", MODEL, "--training-file", from_sample, "--gpus", "1"
        )  # fmt: skip
        assert code == 0, text
        (waiting,) = set(re.findall(r"ftjob-[0-9a-f]+", text))

        def queue_reason() -> str | None:
            got = httpx.get(f"{world.url}/v1/fine_tuning/jobs/{waiting}", headers=world.user).json()
            return got["reason"] if "no online CPod" in (got["reason"] or "") else None

        reason = eventually(queue_reason, what="the scheduler's reason")
        code, shown = run("finetune", "show", waiting)
        assert code == 0 and "queued" in shown and f"waiting: {reason}" in " ".join(shown.split()), shown
        assert run("finetune", "cancel", waiting)[0] == 0

        world.agent("a")
        world.online()
        code, text = run(
            "finetune", "create", "--model", MODEL, "--training-file", from_sample,
            "--epochs", "1", "--suffix", "cli",
        )  # fmt: skip
        assert code == 0, text
        (fine_tune,) = set(re.findall(r"ftjob-[0-9a-f]+", text))
        code, text = run("finetune", "show", fine_tune, "-f")
        assert code == 0 and "succeeded" in text, text
        assert f"ft:{MODEL}:cli:{fine_tune}" in text
        code, text = run("finetune", "checkpoints", fine_tune)
        assert code == 0 and re.search(r"ftckpt-\w+ +│ 3 ", text), text  # 12 examples / 4 a step, 1 epoch

        # An administrator sees every user's fine-tunes with --all, and only their own without it.
        owner = httpx.get(f"{world.url}/api/v1/me", headers=world.user).json()["id"]
        admin_env = {**env, **world.env, "SXWL_CONFIG_DIR": str(tmp_path / "admin-cfg")}
        made = sxwl(
            "admin", "create-user", "--email", "admin@example.com", "--password-stdin",
            "--data-dir", str(tmp_path / "cloud"), env=admin_env, stdin="correct horse\ncorrect horse\n",
        )  # fmt: skip
        assert made.returncode == 0, made.stderr
        login = sxwl(
            "login", "--url", world.url, "--email", "admin@example.com", "--password-stdin",
            env=admin_env, stdin="correct horse\n",
        )  # fmt: skip
        assert login.returncode == 0, login.stderr
        listed = sxwl("finetune", "list", env=admin_env)
        assert listed.returncode == 0 and "No fine-tunes yet" in listed.stdout, listed.stdout
        listed = sxwl("finetune", "list", "--all", env=admin_env)
        assert listed.returncode == 0 and fine_tune in listed.stdout and owner in listed.stdout, listed.stdout
        code, text = run("finetune", "list", "--all")  # a user's --all is their own list
        assert code == 0 and fine_tune in text

        target = tmp_path / "adapter.tar"
        code, text = run("finetune", "download", fine_tune, "-o", str(target))
        assert code == 0, text
        with tarfile.open(target) as tar:
            assert "adapter_config.json" in tar.getnames()
    finally:
        world.close()
