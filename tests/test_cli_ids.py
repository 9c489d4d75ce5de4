"""`sxwl` with the ids users copy, against a served cloud with billing on: every id whole on an
80-column terminal and in piped output, a unique prefix taken wherever an id is, ambiguous and
unknown prefixes refused by name, a dataset with errors failing the upload's exit status, amounts
as people read them, and errors that name `sxwl` commands instead of REST paths."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import httpx
import pytest

from sxwl.protocol.money import money_text
from tests.support.terminal import sxwl_on_terminal
from tests.test_cli import sxwl
from tests.test_finetune_system import MODEL, FineTuneWorld

ADMIN = "admin@example.com"
USER = "dev@example.com"


class Session:
    """The CLI signed in as the world's user, and an admin's commands on the cloud's database."""

    def __init__(self, world: FineTuneWorld, tmp_path: Path) -> None:
        self.world = world
        self.data_dir = str(tmp_path / "cloud")
        self.env = {
            **os.environ,
            **world.env,
            "SXWL_CONFIG_DIR": str(tmp_path / "cfg"),
            "SXWL_ARGON2_TIME_COST": "1",
            "SXWL_ARGON2_MEMORY_KIB": "1024",
        }
        for name in ("COLUMNS", "SXWL_ADMIN_EMAIL"):
            self.env.pop(name, None)

    def run(self, *args: str) -> tuple[int, str, str]:
        done = sxwl(*args, env=self.env)
        return done.returncode, done.stdout, done.stderr

    def admin(self, *args: str) -> None:
        done = sxwl("admin", *args, "--as", ADMIN, "--data-dir", self.data_dir, env=self.env)
        assert done.returncode == 0, done.stdout + done.stderr

    def api(self, path: str) -> Any:
        return httpx.get(f"{self.world.url}{path}", headers=self.world.user).json()


@pytest.fixture
def session(tmp_path: Path, db_url: str) -> Any:
    world = FineTuneWorld(tmp_path, db_url, SXWL_BILLING_ENABLED="true")
    try:
        cli = Session(world, tmp_path)
        made = sxwl(
            "admin", "create-user", "--email", ADMIN, "--password-stdin", "--data-dir", cli.data_dir,
            env=cli.env, stdin="correct horse\ncorrect horse\n",
        )  # fmt: skip
        assert made.returncode == 0, made.stderr
        login = sxwl(
            "login", "--url", world.url, "--email", USER, "--password-stdin",
            env=cli.env, stdin="correct horse\n",
        )  # fmt: skip
        assert login.returncode == 0, login.stderr
        yield cli
    finally:
        world.close()


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_ids_are_whole_and_prefixes_are_taken(session: Session, tmp_path: Path) -> None:
    # A dataset with a wrong line is shown line by line, and the upload fails (exit 3).
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"messages": [{"role": "user", "content": "hi"}]}\nnot json\n')
    code, out, err = session.run("files", "upload", str(broken))
    assert code == 3 and "line 2" in out and "upload it again" in err, (code, out, err)

    # A processed dataset with a long name: its row is wider than 80 columns.
    long_name = "a-dataset-whose-name-is-long-enough-to-widen-every-row-" + "x" * 20 + ".jsonl"
    good = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
    (tmp_path / long_name).write_text("\n".join(json.dumps(good) for _ in range(8)) + "\n")
    code, out, err = session.run("files", "upload", str(tmp_path / long_name))
    assert code == 0, out + err
    files = {f["filename"]: f["id"] for f in session.api("/v1/files")["data"]}
    dataset = files[long_name]

    # A file's prefix is taken by `files show` and by `finetune create --training-file`.
    code, out, err = session.run("files", "show", dataset[:10])
    assert code == 0 and dataset in out and "processed" in out, out + err
    session.admin("prices", "set", "--cpu", "--price", "0.01", "--fee", "10")
    session.admin("top-up", "--email", USER, "--amount", "1")
    made = []
    for _ in range(2):  # no CPod: both stay queued
        code, out, err = session.run("finetune", "create", "--model", MODEL, "--training-file", dataset[:12])
        assert code == 0, out + err
        made.append(re.findall(r"ftjob-[0-9a-f]{24}", out)[0])
    first, second = made

    code, out, err = session.run("finetune", "show", first[:11])
    assert code == 0 and first in out and "queued" in out, out + err

    # An ambiguous prefix names its candidates; an unknown one names the listing command.
    code, out, err = session.run("finetune", "show", "ftjob-")
    assert code == 1 and "matches several fine-tunes" in err and first in err and second in err, err
    code, out, err = session.run("finetune", "checkpoints", "ftjob-zzz")
    assert code == 1 and "no fine-tune 'ftjob-zzz'" in err and "sxwl finetune list" in err, err
    code, out, err = session.run("finetune", "show", f"{first}/events")  # one path segment, no route
    assert code == 1 and "no fine-tune" in err, err
    code, out, err = session.run("finetune", "show", "")
    assert code == 2 and "empty fine-tune id" in err, err
    code, out, err = session.run("files", "delete", "file-zzz")
    assert code == 1 and "no file 'file-zzz'" in err and "sxwl files list" in err, err
    code, out, err = session.run("finetune", "create", "--model", MODEL, "--training-file", "file-zzz")
    assert code == 1 and "--training-file: no file" in err, err

    # An 80-column terminal shows every id whole (a table too narrow for them becomes blocks).
    for args, wanted in (
        (("finetune", "list"), [first, second]),
        (("files", "list"), [dataset, *files.values()]),
        (("finetune", "show", second[:12]), [second]),
    ):
        code, text = sxwl_on_terminal(*args, env=session.env, columns=80)
        assert code == 0, text
        for whole in wanted:
            assert whole in text, (args, whole, text)
        assert "…" not in text, text

    # Piped, a row is not wrapped at 80 columns: the long name stays on its id's line.
    code, out, err = session.run("files", "list")
    (row,) = [line for line in out.splitlines() if dataset in line]
    assert code == 0 and long_name in row and len(row) > 80, out

    # The cancel of a prefix cancels that one fine-tune.
    code, out, err = session.run("finetune", "cancel", second[:12])
    assert code == 0 and f"fine-tune {second}: cancelled" in out, out + err
    assert session.api(f"/v1/fine_tuning/jobs/{first}")["status"] == "queued"
    assert session.run("finetune", "cancel", first)[0] == 0

    # One that runs: followed to its end by a prefix, its cost (below a fen) reads as such, not 0.00.
    session.world.agent("a")
    session.world.online()
    code, out, err = session.run(
        "finetune", "create", "--model", MODEL, "--training-file", dataset, "--epochs", "1", "--suffix", "ids"
    )  # fmt: skip
    assert code == 0, out + err
    third = re.findall(r"ftjob-[0-9a-f]{24}", out)[0]
    code, out, err = session.run("finetune", "show", third[:12], "-f")
    assert code == 0 and "succeeded" in out, out + err
    done = session.api(f"/v1/fine_tuning/jobs/{third}")
    paid = done["cost"]["so_far"]
    assert 0 < paid < 10_000, done["cost"]  # the premise: below a fen
    assert f"cost {money_text(paid)} CNY" in out and money_text(paid) != "0.00", out

    # The adapter's name is whole on a 120-column terminal, and the owner column reads whose a
    # model is, never a raw user id; at 80 columns the rows become blocks, the names still whole.
    me = session.api("/api/v1/me")["id"]
    adapter = done["fine_tuned_model"]
    for columns in (120, 80):
        code, text = sxwl_on_terminal("models", "list", env=session.env, columns=columns)
        assert code == 0 and adapter in text and MODEL in text, text
        assert "public" in text and "you" in text and "system" not in text and me not in text, text
        assert "…" not in text, text

    # A user asking for CPods is pointed at the command and the console page, not a REST path.
    code, out, err = session.run("cpods", "list")
    assert code == 1 and "sxwl gpu-types" in err and "/api/v1" not in err, err
