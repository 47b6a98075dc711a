"""The console in a real headless Chromium against real processes: Redis, `prewarm web` (gunicorn) and a
`prewarm worker` with two CPU virtual GPUs. Log in, preload a model onto a GPU from its card, see the card
show the replica ready, evict it, and save screenshots of the fleet page under the artifacts folder.

Needs Debian's chromium (`apt-get install -y chromium`): Playwright cannot download its own browser here.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from prewarm import events
from tests.model_files import tiny_catalog
from tests.procs import WorkerProc, worker_factory  # noqa: F401 - pytest fixture
from tests.web_support import WebProc

CHROMIUM = "/usr/bin/chromium"
ADMIN = "browser-test-admin-token"
MODEL = "tiny-lm"
GPU = "node-a/cpu:1"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage"]

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not Path(CHROMIUM).exists() and shutil.which("chromium") is None,
                       reason="chromium not installed: apt-get install -y chromium"),
]


@pytest.fixture
def catalog(tmp_path: Path) -> Path:
    return tiny_catalog(tmp_path / "models", [MODEL, "tiny-mlp"])


@pytest.fixture
def web(redis_url: str, catalog: Path, tmp_path: Path) -> Iterator[WebProc]:
    proc = WebProc(redis_url, catalog, tmp_path, env={"PREWARM_ADMIN_TOKEN": ADMIN})
    yield proc
    proc.stop()


def test_console_preload_ready_evict(web: WebProc, catalog: Path, worker_factory, r: redis.Redis,  # noqa: F811
                                     artifacts_dir: Path) -> None:
    from playwright.sync_api import expect, sync_playwright

    w: WorkerProc = worker_factory(catalog, devices="cpu:0=64MiB,cpu:1=64MiB", node="node-a")
    assert GPU in w.gpu_ids
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM if Path(CHROMIUM).exists() else shutil.which("chromium"),
                                     args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.set_default_timeout(60_000)
            page.goto(web.url + "/fleet")
            card = page.locator(f'section.gpu[data-gpu="{GPU}"]')
            expect(card).to_be_visible()
            expect(page.locator('section.gpu[data-gpu="node-a/cpu:0"]')).to_be_visible()
            expect(card.locator('[data-action="preload"]')).to_have_count(0)  # read-only until logged in

            page.click("#login-link")
            page.fill('#login-form input[name="token"]', "not-the-token")
            page.click('#login-form button[type="submit"]')
            expect(page.locator(".flash.error")).to_contain_text("not the admin token")
            page.fill('#login-form input[name="token"]', ADMIN)
            page.click('#login-form button[type="submit"]')
            expect(page.locator(".flash.ok")).to_contain_text("Logged in")

            card.locator('select[name="model"]').select_option(MODEL)
            card.locator('[data-action="preload"]').click()
            expect(page.locator(".flash.ok")).to_contain_text(f"preload of {MODEL} queued on {GPU}")
            # The page refreshes itself: wait for the worker's replica to show up ready on this GPU's card.
            row = card.locator(f'tr.replica[data-model="{MODEL}"]')
            expect(row).to_have_attribute("data-state", "ready", timeout=90_000)
            expect(card.locator(".membar .seg.ready")).to_be_visible()
            page.screenshot(path=str(artifacts_dir / "console-fleet.png"), full_page=True)

            row.locator('[data-action="evict"]').click()
            expect(page.locator(".flash.ok")).to_contain_text(f"evict of {MODEL} queued on {GPU}")
            expect(card.locator(f'tr.replica[data-model="{MODEL}"]')).to_have_count(0, timeout=60_000)
            page.screenshot(path=str(artifacts_dir / "console-fleet-after-evict.png"), full_page=True)

            page.goto(web.url + f"/events?model={MODEL}")
            expect(page.locator('tr[data-kind="preload"][data-actor="operator"]')).to_have_count(1)
            expect(page.locator('tr[data-kind="evict"][data-actor="operator"]')).to_have_count(1)
        finally:
            browser.close()
    kinds = [(e.kind, e.actor) for e in events.read(r, model=MODEL)]
    assert ("preload", "operator") in kinds and ("evict", "operator") in kinds
    assert (artifacts_dir / "console-fleet.png").stat().st_size > 10_000
