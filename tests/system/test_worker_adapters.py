"""LoRA adapters loaded at run time into a real vLLM engine by a real `prewarm worker` (issue 29, item 2),
and routed (item 3): tasks go through Celery by name, state is read back from Redis, the route answer
comes from the real Flask app on the same Redis.

Needs the engine's environment (`prewarm engines install vllm`); without it the test skips and says so.
One engine start for the whole module (about two minutes on this two-core machine): a single test walks
the adapter lifecycle on it. No timing is asserted.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import redis
from celery import Celery

from gpu_worker.demo_hf import tiny_llama_config, write_tiny_llama
from gpu_worker.demo_lora import adapter_tensors, write_lora_adapter
from prewarm import celery_app, events, state, traffic
from prewarm.engines import vllm_python, vllm_venv
from scheduler.live import Scheduler
from tests import procs
from tests.procs import wait_for
from tests.web_support import make_context
from web.app import create_app

worker_factory = procs.worker_factory  # the fixture, used by name

pytestmark = pytest.mark.skipif(
    vllm_python() is None,
    reason=f"the vLLM engine is not installed at {vllm_venv()}: run `prewarm engines install vllm`")

GPU = "node-a/cpu:0"
QUEUE = state.queue_name("node-a", "cpu:0")
ENGINE_TIMEOUT = 900.0  # a cold vLLM start on a busy two-core machine, with the worker's warmup after it
ADAPTERS = {"lora-a": 8, "lora-b": 8, "lora-c": 16}


def catalog(folder: Path) -> Path:
    """The tiny Llama as a vllm base with two LoRA slots, and three adapters of it."""
    folder.mkdir(parents=True)
    write_tiny_llama(folder / "tiny-chat", seed=3)
    text = ('[[models]]\nid = "tiny-chat"\nversion = "v1"\nruntime = "vllm"\npath = "tiny-chat"\n'
            "max_adapters = 2\nmax_cpu_adapters = 4\nmax_lora_rank = 16\n[[models.warmup]]\nprompt_tokens = 16\n")
    for i, (name, rank) in enumerate(ADAPTERS.items()):
        write_lora_adapter(folder / name, tiny_llama_config(), rank=rank, seed=i)
        text += (f'[[models]]\nid = "{name}"\nversion = "v1"\nruntime = "vllm-adapter"\nbase = "tiny-chat"\n'
                 f'path = "{name}"\nrank = {rank}\n[[models.warmup]]\nprompt_tokens = 8\n')
    (folder / "catalog.toml").write_text(text)
    return folder / "catalog.toml"


@pytest.fixture
def celery(redis_url: str) -> Iterator[Celery]:
    app = celery_app.make_celery(redis_url)
    yield app
    app.close()


def send(celery: Celery, name: str, *args: object, timeout: float = 300.0, **kwargs: object) -> dict:
    return celery.send_task(name, args=list(args), kwargs=kwargs, queue=QUEUE).get(timeout=timeout)


def refused(celery: Celery, model: str) -> str:
    with pytest.raises(Exception) as info:  # noqa: PT011 - Celery rebuilds the worker's LoadFailed
        send(celery, celery_app.PRELOAD, model, "v1")
    return str(info.value)


def replicas(r: redis.Redis) -> dict[str, state.Replica]:
    g = state.read_fleet(r).gpu(GPU)
    assert g is not None
    return {x.model: x for x in g.replicas}


def post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        return json.loads(resp.read())


def engine_servers(checkpoint: Path) -> list[psutil.Process]:
    """The API server processes serving this checkpoint (one per engine)."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        if "vllm.entrypoints.openai.api_server" in cmd and str(checkpoint) in cmd and "engine_launcher" not in " ".join(cmd):
            found.append(p)
    return found


def test_adapters_load_serve_fill_their_slots_route_and_go_with_their_base(
        r: redis.Redis, redis_url: str, celery: Celery, tmp_path: Path, worker_factory) -> None:  # noqa: ANN001
    cat = catalog(tmp_path / "models")
    ckpt = tmp_path / "models" / "tiny-chat"
    worker_factory(cat, devices="cpu:0=8GiB", env={"PREWARM_VLLM_VENV": str(vllm_venv()),
                                                   "PREWARM_ADVERTISE_HOST": "127.0.0.1"})

    # No base replica: an adapter has nowhere to load, and says so.
    why = refused(celery, "lora-a")
    assert "cannot load adapter lora-a@v1 on node-a/cpu:0: its base tiny-chat is not ready there (absent)" in why
    assert "preload tiny-chat on node-a/cpu:0 first" in why

    # The base's engine starts with LoRA enabled (its catalog has adapters).
    assert send(celery, celery_app.PRELOAD, "tiny-chat", "v1", timeout=ENGINE_TIMEOUT)["state"] == "ready"
    [server] = engine_servers(ckpt)
    cmd = server.cmdline()
    assert "--enable-lora" in cmd and cmd[cmd.index("--max-loras") + 1] == "2"
    assert cmd[cmd.index("--max-cpu-loras") + 1] == "4" and cmd[cmd.index("--max-lora-rank") + 1] == "16"
    assert server.environ().get("VLLM_ALLOW_RUNTIME_LORA_UPDATING") == "True"
    base = replicas(r)["tiny-chat"]
    assert base.endpoint is not None

    # An adapter loaded at run time: its own replica record, hosted by the base replica, its bytes measured.
    out = send(celery, celery_app.PRELOAD, "lora-a", "v1", timeout=300)
    assert out["state"] == "ready" and out["noop"] is False
    a = replicas(r)["lora-a"]
    assert a.state == "ready" and a.host == "tiny-chat@v1" and a.endpoint == base.endpoint
    assert a.bytes == sum(t.nbytes for t in adapter_tensors(tiny_llama_config(), 8, 0).values())
    used = state.read_fleet(r).gpu(GPU)
    assert used is not None and used.used_bytes >= base.bytes + a.bytes - 1  # both counted on the GPU

    # It answers a completion under its own name, at the base's endpoint and through the infer task.
    answer = post(f"{base.endpoint}/completions", {"model": "lora-a", "prompt": "Hello", "max_tokens": 4})
    assert answer["model"] == "lora-a" and answer["usage"]["completion_tokens"] >= 1
    inf = send(celery, celery_app.INFER, "lora-a", {"prompt": "Hello", "max_tokens": 2}, timeout=120)
    assert inf["model"] == "lora-a" and inf["served_model"] == "lora-a" and inf["base"] == "tiny-chat@v1"

    # Two slots: a second adapter fits, a third is refused in words.
    assert send(celery, celery_app.PRELOAD, "lora-b", "v1", timeout=300)["state"] == "ready"
    why = refused(celery, "lora-c")
    assert "the engine of its base tiny-chat@v1 has all its 2 LoRA slot(s) (max_adapters) taken by lora-a, lora-b" \
        in why and "evict one of them first" in why

    # Unloading frees its slot: the engine forgets it, and the third adapter now loads.
    ev = send(celery, celery_app.EVICT, "lora-b", timeout=120)
    assert ev["noop"] is False and ev["bytes_freed"] > 0
    served = {m["id"] for m in json.loads(urllib.request.urlopen(f"{base.endpoint}/models", timeout=60).read())["data"]}
    assert served == {"tiny-chat", "lora-a"}
    assert send(celery, celery_app.PRELOAD, "lora-c", "v1", timeout=300)["state"] == "ready"
    assert replicas(r)["lora-c"].host == "tiny-chat@v1"

    # The route: an adapter held by the base replica is ready there under its own name; one absent from it
    # gets one adapter load into that replica (no engine start: still the same single engine).
    client = create_app(make_context(redis_url, cat)).test_client()
    route = client.get("/hooks/route?model=lora-a").get_json()
    assert route["state"] == "ready" and route["base"] == "tiny-chat"
    assert route["replicas"][0]["model"] == "lora-a" and route["replicas"][0]["endpoint"] == base.endpoint
    send(celery, celery_app.EVICT, "lora-c", timeout=120)
    route = client.get("/hooks/route?model=lora-b").get_json()
    assert route["state"] == "loading" and route["preload"]["queued"] is True
    assert route["preload"]["host"] == "tiny-chat@v1"
    b = wait_for(lambda: (x := replicas(r).get("lora-b")) is not None and x.state == "ready" and x, 300,
                 what="the on-demand adapter load to turn lora-b ready")
    assert b.host == "tiny-chat@v1" and [p.pid for p in engine_servers(ckpt)] == [server.pid]
    assert client.get("/hooks/route?model=lora-b").get_json()["state"] == "ready"

    # The scheduler plans an adapter from its traffic into the running engine (item 4): lora-b, unloaded and
    # asked for every second, is loaded by the scheduler's own preload into the same engine (no engine start).
    assert send(celery, celery_app.EVICT, "lora-b", timeout=120)["noop"] is False
    now = time.time()
    traffic.record(r, [("lora-b", 1, now - 40 + i) for i in range(38)], now=now)
    sched = Scheduler(make_context(redis_url, cat), ident="s1")
    wait_for(lambda: sched.tick().leader and (x := replicas(r).get("lora-b")) is not None and x.state == "ready",
             300, what="the scheduler's adapter load to turn lora-b ready")
    planned = [e for e in events.read(r, model="lora-b", kind="preload") if e.ts >= now]
    assert planned and planned[0].actor == "scheduler", planned
    assert replicas(r)["lora-b"].host == "tiny-chat@v1" and [p.pid for p in engine_servers(ckpt)] == [server.pid]
    answer = post(f"{base.endpoint}/completions", {"model": "lora-b", "prompt": "Hello", "max_tokens": 2})
    assert answer["model"] == "lora-b"

    # Evicting the base evicts its adapters first, each in the event log with its reason.
    ev = send(celery, celery_app.EVICT, "tiny-chat", reason="test: base goes", timeout=120)
    assert ev["noop"] is False and replicas(r) == {}
    evicted = [e for e in reversed(events.read(r, kind="evicted")) if e.actor == "worker"]
    tail = [(e.model, e.reason) for e in evicted[-3:]]
    reason = "its base tiny-chat is being evicted from node-a/cpu:0 (test: base goes)"
    assert sorted(tail[:2]) == [("lora-a", reason), ("lora-b", reason)]
    assert tail[2] == ("tiny-chat", "test: base goes")
    wait_for(lambda: not engine_servers(ckpt), 60, what="the base's engine to stop")
