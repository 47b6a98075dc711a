"""A real LiteLLM Router with prewarm's routing strategy in front of real vLLM engine replicas (the demo's
`tiny-llama-vllm`, on CPU) that a real worker placed: the warm path, a second replica joining, and the
fallback once the model is evicted, with prewarm's traffic counts against the requests sent.

Needs the engine's environment (`prewarm engines install vllm`) and the `litellm` extra; without either it
skips and says so. The engines start once for the module (each takes minutes on two shared cores), so
the tests run in order and share the fleet.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis

from gpu_worker.demo_hf import write_tiny_llama
from gpu_worker.demo_models import CHECKPOINTS, checkpoint_entry
from prewarm import state, traffic
from prewarm.engines import vllm_python, vllm_venv
from prewarm.redis_server import EmbeddedRedis
from tests.procs import REPO, WorkerProc, start_worker, wait_for
from tests.web_support import WebProc

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
litellm = pytest.importorskip("litellm", reason="the litellm extra is not installed: pip install prewarm[litellm]")

from litellm import Router  # noqa: E402

from prewarm.client import TrafficReporter  # noqa: E402
from prewarm.integrations.litellm import PrewarmRouting, model_groups  # noqa: E402

pytestmark = [
    pytest.mark.skipif(vllm_python() is None,
                       reason=f"the vLLM engine is not installed at {vllm_venv()}: run `prewarm engines install vllm`"),
    pytest.mark.timeout(1800),  # engine starts on a busy two-core machine
]

MODEL = "tiny-llama-vllm"
SPARE = "tiny-llama-vllm-spare"  # its catalog fallback, another engine replica
NODE = "node-a"
GPU0, GPU1, GPU2 = (state.gpu_id(NODE, f"cpu:{i}") for i in range(3))
LOAD_TIMEOUT = 900


@dataclass
class Fleet:
    redis_url: str
    catalog: Path
    web: WebProc
    worker: WorkerProc
    router: Router
    routing: PrewarmRouting
    sent: dict[str, int] = field(default_factory=dict)  # requests sent through LiteLLM, by model asked for

    def ask(self, model: str = MODEL) -> tuple[str, dict]:
        md: dict = {}
        resp = asyncio.run(self.router.atext_completion(model=model, prompt="Hello, world", max_tokens=4,
                                                        temperature=0, metadata=md))
        self.sent[model] = self.sent.get(model, 0) + 1
        assert resp.usage.completion_tokens >= 1
        return resp.choices[0].text, md["prewarm"]

    def op(self, *args: str) -> subprocess.Popen[bytes]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PREWARM_")}
        env.update(PREWARM_REDIS_URL=self.redis_url, PREWARM_CATALOG=str(self.catalog), PYTHONPATH=str(REPO))
        return subprocess.Popen([sys.executable, "-m", "prewarm.programs.cli", *args, "--wait",
                                 "--timeout", str(LOAD_TIMEOUT)], cwd=REPO, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)

    def run(self, *ops: tuple[str, ...]) -> None:
        """Operator commands (`prewarm preload|evict ... --wait`), at once; each must succeed."""
        procs = [self.op(*o) for o in ops]
        for o, p in zip(ops, procs, strict=True):
            out = p.communicate(timeout=LOAD_TIMEOUT + 60)[0].decode(errors="replace")
            assert p.returncode == 0, f"{' '.join(o)} failed:\n{out[-3000:]}\n--- worker ---\n{self.worker.log()[-3000:]}"

    def endpoint(self, model: str, gid: str) -> str:
        r = redis.Redis.from_url(self.redis_url)
        try:
            reps = [x for g in state.read_fleet(r).gpus if g.id == gid for x in g.replicas if x.model == model]
        finally:
            r.close()
        assert reps and reps[0].endpoint, f"{model} has no endpoint on {gid}: {reps}"
        return reps[0].endpoint.rstrip("/")


def write_catalog(root: Path) -> Path:
    demo = next(c for c in CHECKPOINTS if c.id == MODEL)
    entries = []
    for model, seed, fallback in ((MODEL, demo.seed, SPARE), (SPARE, demo.seed + 1, None)):
        write_tiny_llama(root / model, seed=seed)
        c = type(demo)(model, demo.version, demo.runtime, seed, demo.description, demo.warmup)
        entry = checkpoint_entry(c, model)
        if fallback:  # before the entry's [[models.warmup]] tables
            entry = entry.replace("\n[[models.warmup]]", f'\nfallback = "{fallback}"\n[[models.warmup]]', 1)
        entries.append(entry)
    (root / "catalog.toml").write_text("\n".join(entries))
    return root / "catalog.toml"


@pytest.fixture(scope="module")
def fleet(redis_server: EmbeddedRedis, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    work = tmp_path_factory.mktemp("litellm")
    client = redis.Redis.from_url(redis_server.url)
    client.flushall()
    client.close()
    catalog = write_catalog(work / "models")
    web = WebProc(redis_server.url, catalog, work, workers=1)
    worker = start_worker(redis_server.url, catalog, devices="cpu:0=4GiB,cpu:1=4GiB,cpu:2=4GiB", node=NODE,
                          log_dir=work / "worker", env={"PREWARM_ADVERTISE_HOST": "127.0.0.1"})
    reporter = TrafficReporter(web.url)
    routing = PrewarmRouting(reporter=reporter, cold_wait=5.0)
    router = Router(model_list=model_groups([MODEL, SPARE]), num_retries=1)
    router.register_plugin(routing)
    f = Fleet(redis_server.url, catalog, web, worker, router, routing)
    try:
        # The model on one GPU, its fallback on another, started together (each engine takes minutes).
        f.run(("preload", MODEL, "--gpu", GPU0), ("preload", SPARE, "--gpu", GPU2))
        yield f
    finally:
        reporter.close()
        worker.stop(timeout=60)
        web.stop()


def test_a_completion_comes_back_through_litellm_from_the_replica_prewarm_placed(fleet: Fleet) -> None:
    text, stamp = fleet.ask()
    assert text  # the engine's own tokens
    assert stamp["served_by"] == MODEL and stamp["gpu"] == GPU0 and stamp["fallback"] is False
    assert stamp["endpoint"] == fleet.endpoint(MODEL, GPU0)


def test_a_second_replica_on_another_gpu_gets_requests_without_a_config_change(fleet: Fleet) -> None:
    fleet.run(("preload", MODEL, "--gpu", GPU1))
    on_gpu1 = fleet.endpoint(MODEL, GPU1)
    seen = wait_for(lambda: {s["endpoint"] for s in (fleet.ask()[1] for _ in range(4))} >= {on_gpu1} or None,
                    60, interval=0.5, what="a request served by the new replica")
    assert seen
    gpus = {fleet.ask()[1]["gpu"] for _ in range(6)}
    assert gpus == {GPU0, GPU1}  # both replicas serve, with the router built before the second existed


def test_evicted_the_next_request_is_served_by_its_fallback(fleet: Fleet) -> None:
    fleet.run(("evict", MODEL))  # every GPU holding it
    text, stamp = fleet.ask()
    assert text
    assert stamp["fallback"] is True and stamp["model"] == MODEL and stamp["served_by"] == SPARE
    assert stamp["gpu"] == GPU2 and stamp["endpoint"] == fleet.endpoint(SPARE, GPU2)


def test_prewarms_traffic_counts_equal_the_requests_sent(fleet: Fleet) -> None:
    assert fleet.routing.reporter.flush(10)
    r = redis.Redis.from_url(fleet.redis_url)
    try:
        totals = traffic.totals(r)
    finally:
        r.close()
    assert fleet.sent[MODEL] >= 10
    assert {m: totals.get(m, 0) for m in (MODEL, SPARE)} == {MODEL: fleet.sent[MODEL], SPARE: 0}
