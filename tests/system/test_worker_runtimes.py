"""Replicas hosted by the `transformers` and `vllm` runtimes in a real `prewarm worker` process.

Tasks go through Celery by name; state is read back from Redis; the route answer and /api/fleet come from
the real Flask app on the same Redis. The vLLM tests need the engine's environment (PREWARM_VLLM_VENV,
`prewarm engines install vllm`) and skip saying so where it is absent; each engine start takes 30-160 s
on this two-core machine.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import redis
from celery import Celery

from gpu_worker.demo_hf import write_tiny_llama
from prewarm import celery_app, state
from prewarm.engines import DEFAULT_KV_CACHE_BYTES, vllm_python, vllm_venv
from prewarm.safetensors_header import read_weight_set
from tests import procs
from tests.procs import REPO, wait_for
from tests.web_support import make_context
from web.app import create_app

worker_factory = procs.worker_factory  # the fixture, used by name

GPU = "node-a/cpu:0"
QUEUE = state.queue_name("node-a", "cpu:0")
ENGINE_TIMEOUT = 900.0  # a cold vLLM start on a busy two-core machine, with the worker's warmup after it


def catalog_for(folder: Path, runtime: str, *, model: str = "tiny-chat", extra: str = "") -> Path:
    """A catalog of one tiny Llama checkpoint (written here) served by `runtime`."""
    folder.mkdir(parents=True, exist_ok=True)
    write_tiny_llama(folder / model, seed=3)
    cat = folder / "catalog.toml"
    cat.write_text(f'[[models]]\nid = "{model}"\nversion = "v1"\nruntime = "{runtime}"\npath = "{model}"\n{extra}'
                   "[[models.warmup]]\nprompt_tokens = 16\nbatch = 1\n")
    return cat


@pytest.fixture
def celery(redis_url: str) -> Iterator[Celery]:
    app = celery_app.make_celery(redis_url)
    yield app
    app.close()


def gpu(r: redis.Redis) -> state.Gpu:
    g = state.read_fleet(r).gpu(GPU)
    assert g is not None
    return g


def rep(r: redis.Redis, model: str = "tiny-chat") -> state.Replica | None:
    return next((x for x in gpu(r).replicas if x.model == model), None)


def send(celery: Celery, name: str, *args: object, timeout: float = 300.0, **kwargs: object) -> dict:
    return celery.send_task(name, args=list(args), kwargs=kwargs, queue=QUEUE).get(timeout=timeout)


# --- transformers ---------------------------------------------------------------------------------
def test_a_transformers_replica_preloads_infers_and_evicts_with_its_bytes(r: redis.Redis, celery: Celery,
                                                                          tmp_path: Path, worker_factory) -> None:
    cat = catalog_for(tmp_path / "models", "transformers")
    weights = read_weight_set(tmp_path / "models" / "tiny-chat").data_bytes
    worker_factory(cat, devices="cpu:0=256MiB")
    out = send(celery, celery_app.PRELOAD, "tiny-chat", "v1")
    assert out["state"] == "ready" and out["source"] == "storage"
    # The committed bytes are the module's, measured: the checkpoint's tensors plus the buffers computed on
    # the device (rotary frequencies: a few hundred bytes), not the reservation from the headers.
    held = out["bytes"]
    assert weights < held < weights + 4096 and rep(r).total_bytes == weights
    assert out["warmup"][0]["prompt_tokens"] == 16 and out["warmup"][0]["passes"] >= 3
    g = gpu(r)
    assert g.used_bytes == held and rep(r).state == "ready" and rep(r).endpoint is None

    # infer through the task: text in, greedy tokens out (the checkpoint carries its tokenizer)...
    text = send(celery, celery_app.INFER, "tiny-chat", {"prompt": "Hello", "max_tokens": 4})
    assert text["model"] == "tiny-chat" and text["gpu"] == GPU and text["version"] == "v1"
    assert isinstance(text.get("text"), str) or "output" in text
    # ...and with no inputs, the runtime's default forward pass.
    fwd = send(celery, celery_app.INFER, "tiny-chat")
    assert fwd["output"]["finite"] and fwd["input"] == {"batch": 1, "tokens": 16}

    ev = send(celery, celery_app.EVICT, "tiny-chat")
    assert ev["bytes_freed"] == held and ev["used_bytes"] == 0
    assert rep(r) is None and gpu(r).used_bytes == 0


def test_a_checkpoint_without_config_fails_with_the_reason_and_holds_nothing(r: redis.Redis, celery: Celery,
                                                                             tmp_path: Path, worker_factory) -> None:
    cat = catalog_for(tmp_path / "models", "transformers")
    (tmp_path / "models" / "tiny-chat" / "config.json").unlink()  # the catalog checks weights only
    worker_factory(cat, devices="cpu:0=256MiB")
    with pytest.raises(Exception) as err:
        send(celery, celery_app.PRELOAD, "tiny-chat", "v1")
    assert "config.json" in str(err.value)
    failed = rep(r)
    assert failed is not None and failed.state == "failed" and "has no config.json" in (failed.error or "")
    assert failed.bytes == 0 and gpu(r).used_bytes == 0


def test_a_checkpoint_file_swapped_out_of_the_model_roots_after_the_catalog_was_read_fails_the_preload(
        r: redis.Redis, celery: Celery, tmp_path: Path, worker_factory) -> None:
    cat = catalog_for(tmp_path / "models", "transformers")
    ckpt = tmp_path / "models" / "tiny-chat"
    (tmp_path / "outside").mkdir()
    worker_factory(cat, devices="cpu:0=256MiB")  # has read the catalog: every file inside the roots
    for name in ("config.json", "model.safetensors"):
        moved = Path(shutil.move(ckpt / name, tmp_path / "outside" / name))  # the same bytes, outside
        (ckpt / name).symlink_to(moved)
        with pytest.raises(Exception, match="outside the model roots") as err:
            send(celery, celery_app.PRELOAD, "tiny-chat", "v1")
        assert f"{ckpt / name}: resolves to {moved}" in str(err.value)
        failed = rep(r)
        assert failed is not None and failed.state == "failed" and f"{ckpt / name}: resolves to" in (failed.error or "")
        assert str(tmp_path / "models") in (failed.error or "")  # the roots, named
        assert failed.bytes == 0 and gpu(r).used_bytes == 0
        (ckpt / name).unlink()
        shutil.move(moved, ckpt / name)
    assert send(celery, celery_app.PRELOAD, "tiny-chat", "v1")["state"] == "ready"  # back inside: it loads


def test_stage_of_a_checkpoint_runtime_is_refused_clearly(celery: Celery, tmp_path: Path, worker_factory) -> None:
    cat = catalog_for(tmp_path / "models", "transformers")
    worker_factory(cat, devices="cpu:0=256MiB")
    with pytest.raises(Exception, match="no host tier"):
        send(celery, celery_app.STAGE, "tiny-chat", "v1")


def test_stage_of_a_vllm_model_on_cpu_says_plainly_there_is_no_host_tier(r: redis.Redis, celery: Celery,
                                                                         tmp_path: Path, worker_factory) -> None:
    """vLLM's host tier is its sleep mode, which it does not support on CPU: the stage is refused with
    that reason (no engine started for it), the node's staged set stays empty, the failure is an event."""
    from prewarm import events

    cat = catalog_for(tmp_path / "models", "vllm")
    worker_factory(cat, devices="cpu:0=256MiB")
    with pytest.raises(Exception, match="does not support on CPU") as err:
        send(celery, celery_app.STAGE, "tiny-chat", "v1")
    assert "sleep mode (level 1" in str(err.value)
    assert state.read_staged(r).get("node-a", []) == []
    ev = events.read(r, kind="failed", model="tiny-chat")
    assert ev and "does not support on CPU" in ev[0].reason


# --- vllm -----------------------------------------------------------------------------------------
needs_vllm = pytest.mark.skipif(
    vllm_python() is None,
    reason=f"the vLLM engine is not installed at {vllm_venv()}: run `prewarm engines install vllm` "
           "(or set PREWARM_VLLM_VENV) to run the worker's vLLM tests")


def engine_processes(checkpoint: Path) -> list[psutil.Process]:
    """Every process whose command line names this checkpoint (the launcher, the server, its engine core)."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if str(checkpoint) in " ".join(p.info["cmdline"] or []):
                found.append(p)
        except psutil.Error:
            continue
    return found


def vllm_worker(worker_factory, cat: Path, devices: str = "cpu:0=8GiB"):  # noqa: ANN001, ANN201
    env = {"PREWARM_VLLM_VENV": str(vllm_venv()), "PREWARM_ADVERTISE_HOST": "127.0.0.1"}
    return worker_factory(cat, devices=devices, env=env)


@needs_vllm
def test_a_vllm_replica_serves_at_its_endpoint_is_routed_there_and_evicts_to_nothing(
        r: redis.Redis, redis_url: str, celery: Celery, tmp_path: Path, worker_factory) -> None:
    cat = catalog_for(tmp_path / "models", "vllm")
    ckpt = tmp_path / "models" / "tiny-chat"
    vllm_worker(worker_factory, cat)
    out = send(celery, celery_app.PRELOAD, "tiny-chat", "v1", timeout=ENGINE_TIMEOUT)
    assert out["state"] == "ready"
    ready = rep(r)
    assert ready is not None and ready.state == "ready"
    endpoint = ready.endpoint
    assert endpoint and endpoint.startswith("http://127.0.0.1:") and endpoint.endswith("/v1")
    # The committed bytes are what the engine measured (its process tree), not the weights + KV cache it
    # asked for: on CPU its footprint is far above the 1.6 MB model.
    asked = read_weight_set(ckpt).data_bytes + DEFAULT_KV_CACHE_BYTES
    assert ready.total_bytes == asked and ready.bytes > read_weight_set(ckpt).data_bytes
    assert gpu(r).used_bytes == ready.bytes

    # A router sends straight to the endpoint: a real completion.
    req = urllib.request.Request(f"{endpoint}/completions", method="POST", headers={"Content-Type": "application/json"},
                                 data=json.dumps({"model": "tiny-chat", "prompt": "Hello", "max_tokens": 4}).encode())
    with urllib.request.urlopen(req, timeout=120) as resp:
        answer = json.loads(resp.read())
    assert answer["choices"][0]["text"] is not None and answer["usage"]["completion_tokens"] >= 1

    # The route answer and /api/fleet carry the endpoint; so does `prewarm fleet --json`.
    client = create_app(make_context(redis_url, cat)).test_client()
    route = client.get("/hooks/route?model=tiny-chat").get_json()
    assert route["state"] == "ready" and route["replicas"][0]["endpoint"] == endpoint
    fleet = client.get("/api/fleet").get_json()
    assert [x["endpoint"] for g in fleet["gpus"] for x in g["replicas"]] == [endpoint]
    env = procs.worker_env(redis_url, cat, "cpu:0=8GiB", "node-a")
    cli = subprocess.run([sys.executable, "-m", "prewarm.programs.cli", "fleet", "--json"], cwd=str(REPO), env=env,
                         capture_output=True, text=True, timeout=120)
    assert cli.returncode == 0, cli.stderr
    assert [x["endpoint"] for g in json.loads(cli.stdout)["gpus"] for x in g["replicas"]] == [endpoint]

    # infer works through the task too (a completion through the endpoint).
    inf = send(celery, celery_app.INFER, "tiny-chat", {"prompt": "Hello", "max_tokens": 2}, timeout=120)
    assert inf["gpu"] == GPU and inf["endpoint"] == endpoint and inf["usage"]["completion_tokens"] >= 1

    # The heartbeat measures the engine again while it serves: the record and the GPU's accounting show
    # what its processes hold now (PSS moves by pages as it serves), not the figure from ready.
    def moved() -> state.Replica | None:
        send(celery, celery_app.INFER, "tiny-chat", {"prompt": "Hello again", "max_tokens": 4}, timeout=120)
        x = rep(r)
        return x if x is not None and x.bytes != ready.bytes else None

    later = wait_for(moved, 120, interval=1.0, what="a heartbeat to publish the engine's bytes measured again")
    assert later.state == "ready" and later.bytes > read_weight_set(ckpt).data_bytes
    wait_for(lambda: (x := rep(r)) is not None and gpu(r).used_bytes == x.bytes, 30,
             what="the GPU's used bytes to follow the re-measured engine")

    assert engine_processes(ckpt), "the engine's processes should be running while it is ready"
    ev = send(celery, celery_app.EVICT, "tiny-chat", timeout=120)
    assert ev["bytes_freed"] > read_weight_set(ckpt).data_bytes and ev["used_bytes"] == 0
    assert rep(r) is None
    assert engine_processes(ckpt) == [], "evict must leave no engine process"


@needs_vllm
def test_an_engine_that_dies_while_ready_fails_its_replica_with_the_reason(
        r: redis.Redis, celery: Celery, tmp_path: Path, worker_factory) -> None:
    cat = catalog_for(tmp_path / "models", "vllm")
    ckpt = tmp_path / "models" / "tiny-chat"
    w = vllm_worker(worker_factory, cat)
    send(celery, celery_app.PRELOAD, "tiny-chat", "v1", timeout=ENGINE_TIMEOUT)
    assert rep(r).state == "ready" and gpu(r).used_bytes > 0
    # The engine crashes: SIGKILL its server (the launcher's child) from outside the worker.
    launcher = next(p for p in engine_processes(ckpt) if "engine_launcher.py" in " ".join(p.cmdline()))
    launcher.children()[0].kill()
    failed = wait_for(lambda: (x := rep(r)) is not None and x.state == "failed" and x, 60,
                      what="the heartbeat to fail the dead engine's replica", log=w.log)
    assert "exited with status" in failed.error and "last lines of the engine's log" in failed.error
    assert failed.endpoint is None and failed.bytes == 0
    assert gpu(r).used_bytes == 0
    wait_for(lambda: engine_processes(ckpt) == [], 30, what="no process of the dead engine left")
    assert os.path.exists(str(ckpt))  # (the checkpoint itself is untouched)


# --- accounting -----------------------------------------------------------------------------------
def test_a_measured_footprint_past_the_free_budget_is_refused_and_nothing_is_committed() -> None:
    from gpu_worker.device import make_device
    from gpu_worker.errors import DoesNotFit
    from prewarm.config import DeviceSpec

    dev = make_device(DeviceSpec("cpu:0", 1000), "n/cpu:0")
    dev.reserve("other", 300)
    dev.commit("other", 300)
    dev.reserve("engine", 200)  # what the runtime asked for fits...
    with pytest.raises(DoesNotFit, match=r"engine measured .* once loaded, but GPU n/cpu:0 has room for .*700 bytes"):
        dev.commit_measured("engine", 900)  # ...what it really holds does not
    assert dev.inventory().used_bytes == 500  # still the reservation; the worker then releases it
    dev.commit_measured("engine", 700)  # exactly the room left: committed
    assert dev.inventory().used_bytes == 1000 and dev.release("engine") == 700


# --- no orphan engine after a SIGKILLed worker -------------------------------------------------------
STANDIN = ("import os, subprocess, sys, time\n"
           "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"  # the 'engine core'
           "time.sleep(600)\n")


def test_a_restarted_worker_stops_the_engines_its_predecessor_recorded_before_announcing(
        r: redis.Redis, tmp_path: Path, worker_factory) -> None:
    """The path for an engine that outlived its worker (a launcher without prctl, or killed itself): a
    stand-in engine (a process group of two, the engine id in their environment) is recorded as a dead
    worker's engine; the next worker on that GPU stops it before the GPU joins the fleet. A process whose
    pid is recorded with another start time (a reused pid) is left alone."""
    from gpu_worker.runtimes.engine_records import ENGINE_ID_ENV, EngineRecord, EngineRecords

    data = tmp_path / "data"
    records = EngineRecords(data / "engines")
    engine = subprocess.Popen([sys.executable, "-c", STANDIN], start_new_session=True,
                              env={**os.environ, ENGINE_ID_ENV: "e1"})
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    try:
        core = wait_for(lambda: psutil.Process(engine.pid).children(), 30, what="the stand-in's child")[0]
        records.add(EngineRecord("e1", GPU, "tiny-chat", "v1", engine.pid, psutil.Process(engine.pid).create_time(),
                                 port=1, worker_pid=999999))
        records.add(EngineRecord("e2", GPU, "other", "v1", bystander.pid,
                                 psutil.Process(bystander.pid).create_time() - 100.0, port=2, worker_pid=999999))
        assert len(records.records(GPU)) == 2
        cat = catalog_for(tmp_path / "models", "transformers")
        w = worker_factory(cat, devices="cpu:0=256MiB", env={"PREWARM_DATA_DIR": str(data)})
        # Announced (worker_factory waited for its heartbeat): the recorded engine is gone already.
        assert engine.poll() is not None
        assert not core.is_running() or core.status() == psutil.STATUS_ZOMBIE
        assert bystander.poll() is None, "a process with the recorded pid but another start time was killed"
        assert records.records(GPU) == []
        assert "stopped 2 leftover process(es)" in w.log() and "already gone" in w.log()
    finally:
        for p in (engine, bystander):
            if p.poll() is None:
                os.killpg(p.pid, 9)
                p.wait()


# The launch path as a worker runs it (VllmRuntime, the spawner thread, engine_launcher.py, the engine
# record); only the engine command is the stand-in (tests/engine_standin.py: a server whose "engine core"
# and "worker" hide the engine's id, as vLLM's renamed processes do).
KILLED_WITH_LAUNCHER = """
import json, sys, time
from pathlib import Path
from gpu_worker.runtimes import ReplicaSpec
from gpu_worker.runtimes.engine_records import EngineRecords
from gpu_worker.runtimes.vllm_engine import VllmRuntime

ckpt, data, gpu, standin = sys.argv[1:5]

class StandIn(VllmRuntime):
    def command(self, python, port):
        return [str(python), standin, "server", str(port)]

rt = StandIn(ReplicaSpec(model="tiny-chat", version="v1", path=Path(ckpt), gpu=gpu), python=sys.executable,
             host="127.0.0.1", log_dir=data, records=EngineRecords(Path(data) / "engines"), start_timeout=120)
rt.load()
print(json.dumps({"pgid": rt.pgid, "launcher": rt.proc.pid, "port": rt.port}), flush=True)
time.sleep(600)
"""


RENAMED = ["VLLM::EngineCor", "VLLM::Worker"]  # what the stand-ins' names read as (15 characters at most)


def _renamed(group: list[psutil.Process]) -> list[psutil.Process] | None:
    """The group once all four processes run and the core and the worker have renamed themselves."""
    try:
        names = sorted(n for p in group if (n := p.name()).startswith("VLLM::"))
        return group if len(group) == 4 and names == RENAMED else None
    except psutil.Error:
        return None


def _running(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def test_a_restarted_worker_ends_the_whole_engine_group_a_killed_worker_and_launcher_left(
        r: redis.Redis, tmp_path: Path, worker_factory) -> None:
    """Worker and launcher SIGKILLed together leave the engine's server, its renamed "engine core" and
    "worker" (no PREWARM_ENGINE_ID to be seen) running; the next worker on that GPU ends the whole process
    group recorded at launch, port included, before the GPU joins the fleet."""
    from gpu_worker.runtimes.engine_records import ENGINE_ID_ENV, EngineRecords
    from gpu_worker.runtimes.vllm_engine import group_members, port_is_free

    cat = catalog_for(tmp_path / "models", "transformers")
    data = tmp_path / "data"
    out = tmp_path / "first-worker.out"
    with out.open("wb") as f:
        first = subprocess.Popen([sys.executable, "-c", KILLED_WITH_LAUNCHER, str(tmp_path / "models" / "tiny-chat"),
                                  str(data), GPU, str(REPO / "tests" / "engine_standin.py")],
                                 cwd=REPO, stdout=f, stderr=subprocess.STDOUT)
    tree: list[psutil.Process] = []
    info: dict = {}
    try:
        line = wait_for(lambda: out.read_text().strip().startswith("{") and out.read_text(), 120,
                        what="the stand-in engine to be healthy", log=out.read_text)
        info = json.loads(line.strip().splitlines()[-1])
        tree = wait_for(lambda: _renamed(group_members(info["pgid"])), 60,
                        what="launcher, server, engine core and worker (renamed) in one group")
        hidden = [p for p in tree if ENGINE_ID_ENV not in p.environ()]
        assert sorted(p.name() for p in hidden) == RENAMED  # what the environment search cannot see
        launcher = psutil.Process(info["launcher"])
        launcher.kill()  # first: the worker's death alone would make the launcher take its group down
        first.kill()
        first.wait()
        wait_for(lambda: not _running(launcher), 30, what="the launcher to be gone")
        engine = [p for p in tree if p.pid != launcher.pid]
        assert all(_running(p) for p in engine)  # what the finding saw: the engine outlives both

        w = worker_factory(cat, devices="cpu:0=256MiB", env={"PREWARM_DATA_DIR": str(data)})
        # Announced (worker_factory waited for its heartbeat): the whole group is gone already.
        assert [p.pid for p in engine if _running(p)] == []
        assert group_members(info["pgid"]) == [] and port_is_free(info["port"])
        assert EngineRecords(data / "engines").records(GPU) == []
        assert "stopped 3 leftover process(es)" in w.log()
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
        for p in tree + (group_members(info["pgid"]) if info else []):
            if _running(p):
                p.kill()


@needs_vllm
def test_a_sigkilled_worker_takes_its_ready_engine_with_it(r: redis.Redis, celery: Celery, tmp_path: Path,
                                                           worker_factory) -> None:
    cat = catalog_for(tmp_path / "models", "vllm")
    ckpt = tmp_path / "models" / "tiny-chat"
    data = tmp_path / "data"
    w = worker_factory(cat, devices="cpu:0=8GiB", env={"PREWARM_VLLM_VENV": str(vllm_venv()),
                                                       "PREWARM_ADVERTISE_HOST": "127.0.0.1",
                                                       "PREWARM_DATA_DIR": str(data)})
    send(celery, celery_app.PRELOAD, "tiny-chat", "v1", timeout=ENGINE_TIMEOUT)
    assert rep(r).state == "ready"
    from gpu_worker.runtimes.vllm_engine import group_members

    launcher = next(p for p in engine_processes(ckpt) if "engine_launcher.py" in " ".join(p.cmdline()))
    group = group_members(launcher.pid)  # the launcher leads the engine's process group
    assert len(group) >= 3, [p.cmdline() for p in group]  # launcher, API server, engine core
    recorded = list((data / "engines").rglob("*.json"))
    assert len(recorded) == 1  # the engine is written down while it runs
    w.kill()  # SIGKILL: no shutdown, no release
    wait_for(lambda: not group_members(launcher.pid) and engine_processes(ckpt) == [], 60, interval=0.2,
             what="the engine to die with its worker")
    # The record outlived the worker; the next worker on this GPU finds it (its processes already gone) and
    # drops it before announcing.
    assert recorded[0].exists()
    w2 = worker_factory(cat, devices="cpu:0=8GiB", env={"PREWARM_DATA_DIR": str(data)})
    assert not recorded[0].exists() and "already gone" in w2.log()
