"""A dev environment in Chromium (docs/dev-envs.md): created from the console's 开发环境 page with a
file mounted, opened with its Open button, JupyterLab's own UI loaded from /dev/<id>/ through the
cloud and the agent's tunnel; a notebook cell reads the mounted file and writes to the workspace, a
terminal (its WebSocket through the tunnel) runs a command; another user's browser and an anonymous
one are refused; the agent killed while the notebook's kernel is open, and after a new agent dials
again the page, not reloaded, reconnects to the same kernel and runs a cell. The world (a cloud, a real agent
running a real JupyterLab in its sandbox) is the one of tests/test_dev_envs.py."""

from __future__ import annotations

import re
import signal
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, Locator, Page, expect

from tests.support.agent import eventually
from tests.support.browser import new_context, screenshot, sign_in
from tests.test_dev_envs import World, kernel_says, upload_notes, world_at

pytest.importorskip("jupyterlab", reason="JupyterLab comes with the devenv extra")

# JupyterLab's first load (its bundles through the tunnel) and a kernel's start are slow on 2 cores.
LAB_TIMEOUT_MS = 90_000


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    with world_at(tmp_path) as w:
        yield w


def _run_cell(lab: Page, code: str, expected: str) -> None:
    """Types ``code`` into the notebook's last cell, runs it (Shift+Enter) and waits for ``expected``
    in that cell's output. Typing waits for an idle kernel and the cell's edit mode: JupyterLab
    focuses the notebook in command mode once its kernel is up, where letters are shortcuts."""
    status_bar = lab.locator("#jp-main-statusbar")
    expect(status_bar).to_contain_text("| Idle", timeout=LAB_TIMEOUT_MS)
    cells = lab.locator(".jp-Notebook .jp-CodeCell")
    cell = cells.nth(cells.count() - 1)  # fixed now: running it adds a new last cell
    editor = cell.locator(".cm-content")
    editor.click()
    expect(status_bar).to_contain_text("Mode: Edit")
    lab.keyboard.type(code)
    expect(editor).to_have_text(code)
    lab.keyboard.press("Shift+Enter")
    expect(cell.locator(".jp-OutputArea-output")).to_contain_text(expected, timeout=LAB_TIMEOUT_MS)


def test_jupyterlab_opens_from_the_console_runs_a_notebook_and_a_terminal_and_survives_the_agent(
    browser: Browser, world: World
) -> None:
    file_id = upload_notes(world)

    context = new_context(browser, world.url)
    page = context.new_page()
    try:
        sign_in(page, "dev@example.com")
        page.goto("/dev-envs")
        form = page.locator("#dev-form")
        form.locator("input[name=name]").fill("notebook")
        form.locator("input[name=gpus]").fill("1")
        form.locator("select[name=files]").select_option(file_id)
        page.locator("#dev-create").click()
        expect(page).to_have_url(re.compile(r"/dev-envs\?notice=dev_created$"))
        row = page.locator("#dev-envs tr", has_text="notebook")
        expect(row).to_contain_text("/sxwl/work/inputs/file-0")
        env_id = row.get_attribute("data-env")
        assert env_id
        for _ in range(90):  # the page does not refresh itself: reload until it shows Open
            if row.locator(".dev-open").count():
                break
            page.wait_for_timeout(1000)
            page.reload()
        with context.expect_page() as opened:
            row.locator(".dev-open").click()
        lab = opened.value
        # The tab shows JupyterLab's launcher once its socket answers through the tunnel; before
        # that the cloud answers 502/503, so reload until the app is there.
        for _ in range(90):
            lab.wait_for_load_state()
            if lab.locator(".jp-LabShell").count():
                break
            lab.wait_for_timeout(1000)
            lab.reload()
        assert lab.url.startswith(f"{world.url}/dev/{env_id}/")
        launcher = lab.locator(".jp-LauncherCard[data-category=Notebook]").first
        expect(launcher).to_be_visible(timeout=LAB_TIMEOUT_MS)
        screenshot(lab, "dev-env-jupyterlab")

        # A notebook: its kernel's WebSocket through the cloud and the tunnel.
        launcher.click()
        expect(lab.locator(".jp-Notebook .jp-CodeCell")).to_have_count(1, timeout=LAB_TIMEOUT_MS)
        _run_cell(
            lab,
            "import json; m = json.load(open('/sxwl/work/inputs/file-0'))['messages'][1]['content']; "
            "open('from-notebook.txt', 'w').write(m * 2); print('mounted', m)",
            "mounted hello",
        )
        said = lab.request.get(f"/dev/{env_id}/api/contents/from-notebook.txt")
        assert said.status == 200 and said.json()["content"] == "hellohello"

        # A terminal: its own WebSocket; what it writes lands in the workspace.
        lab.locator(".lm-MenuBar-item", has_text="File").click()
        lab.locator(".lm-Menu-item[data-type=submenu]", has_text="New").first.hover()
        lab.locator(".lm-Menu-item[data-command='terminal:create-new']").click()
        terminal = lab.locator(".jp-Terminal").last
        expect(terminal).to_be_visible(timeout=LAB_TIMEOUT_MS)
        terminal.click()
        lab.keyboard.type("echo sum=$((20+22)) > from-terminal.txt\n")

        def terminal_wrote() -> bool:
            got = lab.request.get(f"/dev/{env_id}/api/contents/from-terminal.txt")
            return got.status == 200 and got.json()["content"] == "sum=42\n"

        eventually(terminal_wrote, timeout=60, what="the terminal's command to write its file")
        screenshot(lab, "dev-env-terminal")

        # Nobody else: another user's browser gets a 404, an anonymous one a 401.
        other = new_context(browser, world.url)
        try:
            other_page = other.new_page()
            sign_in(other_page, "other@example.com")
            refused = other_page.goto(f"/dev/{env_id}/lab")
            assert refused is not None and refused.status == 404
            expect(other_page.locator(".jp-LabShell")).to_have_count(0)
        finally:
            other.close()
        anonymous = new_context(browser, world.url)
        try:
            refused = anonymous.new_page().goto(f"/dev/{env_id}/lab")
            assert refused is not None and refused.status == 401
        finally:
            anonymous.close()

        # The agent killed with the notebook's kernel open; JupyterLab and its kernel outlive it (an
        # agent leaves its jobs running), a new agent on the same state dir takes the environment
        # back and dials again. While the agent was away the cloud said 503, on which JupyterLab keeps
        # asking after its kernel; a poll that met it makes JupyterLab show its "Server Connection
        # Error … will continue trying to reconnect" note, which the user closes, as the handler
        # below does whenever it shows. The page, as it is, reconnects to the same kernel (the
        # cloud holds its socket's handshake until the agent is back) and shows it idle again: what
        # a cell set before the kill is still there.
        dismissed: list[str] = []

        def dismiss(dialog: Locator) -> None:
            dismissed.append(dialog.inner_text())
            dialog.locator(".jp-Dialog-button", has_text="Close").click()  # its footer's only button

        lab.add_locator_handler(lab.locator(".jp-Dialog", has_text="Server Connection Error"), dismiss)
        (kernel,) = lab.request.get(f"/dev/{env_id}/api/kernels").json()
        world.agent.signal(signal.SIGKILL)
        world.agent.wait()  # gone: what answers next came through the new agent's tunnel
        while_away = lab.request.get(f"/dev/{env_id}/api/status")
        assert while_away.status == 503 and while_away.headers["retry-after"] == "5"
        # A kernel's socket opened while the agent is away is held, not refused, and connects
        # once the agent is back (a refused one would leave the page waiting 10 to 30 s more).
        signed_in = {c["name"]: c["value"] for c in context.cookies()}
        with ThreadPoolExecutor(1) as pool, httpx.Client(cookies=signed_in) as client:
            held = pool.submit(kernel_says, world.url, client, env_id, kernel["id"], "m")
            world.agent = world.start_agent("agent", "dev")
            assert held.result(timeout=120) == "'hello'"
        eventually(
            lambda: lab.request.get(f"/dev/{env_id}/api/status").status == 200,
            timeout=90,
            what="the tunnel dialled again",
        )
        lab.locator(".lm-TabBar-tab", has_text="Untitled").first.click(timeout=LAB_TIMEOUT_MS)
        _run_cell(lab, "print('after the re-dial', m)", "after the re-dial hello")
        assert all("continue trying to reconnect" in text for text in dismissed)
    finally:
        context.close()
