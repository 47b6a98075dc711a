"""The console shows the whole fleet (issue 14 item 7), in a real headless Chromium against a real worker,
web and scheduler: the fleet grouped by node with each node's host cache beside its GPUs, a loading
replica's progress and ETA, each replica's last decision on expand, the SLO line with the current budget;
and the ROI page. Screenshots go under the artifacts folder.

A second node (node-b) is announced with the worker's own heartbeat functions, holding a replica that is
loading (a tiny real load is over before a browser could look at it).
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest
import redis
import requests

from prewarm import events, state
from prewarm.store import lookup_counts
from tests.model_files import tiny_catalog
from tests.procs import WorkerProc, wait_for, worker_factory  # noqa: F401 - pytest fixture
from tests.scheduler_procs import SchedulerProc
from tests.web_support import MIB, WebProc, publish_gpu, replica

from .test_console_browser import CHROMIUM, CHROMIUM_ARGS

ADMIN = "fleet-browser-admin-token"
MODEL = "tiny-lm"

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not Path(CHROMIUM).exists() and shutil.which("chromium") is None,
                       reason="chromium not installed: apt-get install -y chromium"),
]


def _announce_node_b(r: redis.Redis) -> None:
    now = time.time()
    loading = replica("tiny-mlp", "node-b/cpu:0", "loading", mib=0, progress=0.4, since=now - 4.0)
    publish_gpu(r, "node-b/cpu:0", total_mib=64, replicas=[loading], ttl=600)
    staged = state.Staged("tiny-lm-wide", "v1", "node-b", "staged", bytes=3 * MIB, total_bytes=3 * MIB,
                          progress=1.0, staged_at=now - 60)
    state.write_node(r, state.Node("node-b", 256 * MIB, 3 * MIB, 253 * MIB, now, "fake-worker"), [staged], 600)


def test_the_fleet_page_shows_nodes_host_caches_etas_decisions_and_the_slo(
        redis_url: str, r: redis.Redis, tmp_path: Path, worker_factory, artifacts_dir: Path) -> None:  # noqa: F811
    from playwright.sync_api import expect, sync_playwright

    catalog = tiny_catalog(tmp_path / "models", [MODEL, "tiny-mlp", "tiny-lm-wide"])
    w: WorkerProc = worker_factory(catalog, devices="cpu:0=64MiB,cpu:1=64MiB", node="node-a")
    web = WebProc(redis_url, catalog, tmp_path, env={"PREWARM_ADMIN_TOKEN": ADMIN})
    sched = SchedulerProc(redis_url, catalog, tmp_path, env={"PREWARM_COLD_START_SLO": "share=0.05,window=1m"})
    try:
        resp = requests.post(f"{web.url}/api/models/{MODEL}/preload", json={"gpu": "node-a/cpu:1"},
                             headers={"Authorization": f"Bearer {ADMIN}"}, timeout=10)
        assert resp.status_code == 202, resp.text
        wait_for(lambda: any(x.state == "ready" for x in state.read_fleet(r).replicas(MODEL)), 60,
                 what=f"{MODEL} ready", log=w.log)
        # a window of route lookups, most not ready (as the route hook counts them): the SLO is breached
        for i in range(30):
            lookup_counts.count_lookup(r, "tiny-mlp", None if i % 2 else (MODEL, "v1", "node-a/cpu:1"), time.time())
        wait_for(lambda: events.read(r, kind="slo"), 60, what="the scheduler's slo event", log=sched.log)
        _announce_node_b(r)
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM if Path(CHROMIUM).exists()
                                         else shutil.which("chromium"), args=CHROMIUM_ARGS)
            try:
                page = browser.new_page(viewport={"width": 1400, "height": 1000})
                page.set_default_timeout(60_000)
                page.goto(web.url + "/fleet")
                node_a = page.locator('section.node[data-node="node-a"]')
                node_b = page.locator('section.node[data-node="node-b"]')
                expect(node_a.locator("section.gpu")).to_have_count(2)
                expect(node_a.locator(".hostcache")).to_be_visible()  # the real worker's host cache
                expect(node_b.locator('section.gpu[data-gpu="node-b/cpu:0"]')).to_be_visible()
                expect(node_b.locator('.hostcache li[data-model="tiny-lm-wide"]')).to_contain_text("tiny-lm-wide")
                expect(node_b.locator(".hostcache .hostbytes")).to_contain_text("3.0 MiB of 256.0 MiB")
                row = node_b.locator('tr.replica[data-model="tiny-mlp"]')
                expect(row).to_have_attribute("data-state", "loading")
                expect(row.locator(".progress")).to_be_visible()
                expect(row.locator(".eta")).to_contain_text("ready in ~")
                slo_line = page.locator("#slo-line")
                expect(slo_line).to_contain_text("cold-start share <= 5.0% per 1 min window")
                expect(slo_line).to_contain_text("above the line")
                expect(slo_line).to_contain_text("budget 70%")
                expect(page.locator("#speculative-budget")).to_contain_text("70%")
                ready = node_a.locator(f'tr.replica[data-model="{MODEL}"]')
                expect(ready).to_have_attribute("title", "last decision: preload by operator: operator preload from the console")
                ready.locator("details.why summary").click()
                expect(ready.locator("details.why .decision")).to_contain_text("operator")
                page.screenshot(path=str(artifacts_dir / "console-fleet-nodes.png"), full_page=True)

                page.goto(web.url + "/roi?window=900")
                expect(page.locator(f'tr.roi-row[data-model="{MODEL}"]')).to_be_visible()
                expect(page.locator("#roi-total-memory")).to_contain_text("GiB·h")
                page.screenshot(path=str(artifacts_dir / "console-roi.png"), full_page=True)
            finally:
                browser.close()
    finally:
        sched.stop()
        web.stop()
    assert (artifacts_dir / "console-fleet-nodes.png").stat().st_size > 10_000
