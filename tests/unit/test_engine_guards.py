"""What the runtimes decide before any engine or CUDA call, checked on CPU: the vLLM command and environment
on CUDA and on CPU (sleep mode, dev endpoints, graphs), the host tier's guards, the engine records' files,
`prewarm engines`' host tier, the torch runtime's `cuda_graphs` flag (plan, eager fallback, the note on
CPU), and the model-roots check of a vllm checkpoint directory before its engine is started. The CUDA paths themselves run where a GPU is lent (tests/system/test_worker_cuda.py)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
import torch
from safetensors.torch import save_file

from gpu_worker.device import make_device
from gpu_worker.runtimes import ReplicaSpec
from gpu_worker.runtimes.checkpoint import check_files
from gpu_worker.runtimes.cuda_graphs import GraphSet, plan
from gpu_worker.runtimes.engine_records import (
    ENGINE_ID_ENV,
    EngineRecord,
    EngineRecords,
    group_members,
    port_is_free,
)
from gpu_worker.runtimes.errors import CheckpointError, EngineFailed
from gpu_worker.runtimes.torch_module import TorchRuntime
from gpu_worker.runtimes.vllm_engine import NO_HOST_TIER_CPU, VllmRuntime
from gpu_worker.runtimes.warmup import WarmupPolicy
from prewarm.catalog import load_catalog
from prewarm.catalog_entries import CatalogError, ModelEntry
from prewarm.config import DeviceSpec
from prewarm.engines import VLLM_HOST_TIER_CPU, VLLM_HOST_TIER_CUDA, engine_status
from tests.model_files import tiny_catalog
from tests.procs import wait_for

GiB = 1 << 30


def runtime(device: str, tmp_path: Path) -> VllmRuntime:
    spec = ReplicaSpec(model="m", version="v1", path=tmp_path, device=device, gpu=f"n/{device}",
                       kv_cache_bytes=GiB, device_total_bytes=80 * GiB if device.startswith("cuda") else None)
    rt = VllmRuntime(spec, host="127.0.0.1", log_dir=tmp_path)
    rt.weights_bytes = 3 * GiB
    return rt


def test_on_cuda_the_engine_runs_with_sleep_mode_its_dev_endpoints_and_its_graphs(tmp_path: Path,
                                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VLLM_SERVER_DEV_MODE", raising=False)
    rt = runtime("cuda:1", tmp_path)
    cmd = rt.command(Path("/venv/bin/python"), 8123)
    assert "--enable-sleep-mode" in cmd
    assert cmd[cmd.index("--gpu-memory-utilization") + 1] == "0.0500"  # (3 + 1) GiB of 80
    assert "--enforce-eager" not in cmd  # vLLM captures its CUDA graphs
    assert "--kv-cache-memory-bytes" not in cmd
    env = rt.environment()
    assert env["VLLM_SERVER_DEV_MODE"] == "1" and env["CUDA_VISIBLE_DEVICES"] == "1"
    assert env[ENGINE_ID_ENV] == rt.engine_id
    assert rt.host_tier() is None


def test_on_cpu_there_is_no_sleep_mode_and_sleep_is_refused_without_asking_the_engine(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VLLM_SERVER_DEV_MODE", raising=False)
    rt = runtime("cpu", tmp_path)
    cmd = rt.command(Path("/venv/bin/python"), 8123)
    assert "--enable-sleep-mode" not in cmd and "--gpu-memory-utilization" not in cmd
    assert cmd[cmd.index("--kv-cache-memory-bytes") + 1] == str(GiB)
    env = rt.environment()
    assert "VLLM_SERVER_DEV_MODE" not in env and env["VLLM_TARGET_DEVICE"] == "cpu"
    assert rt.host_tier() == NO_HOST_TIER_CPU and "does not support on CPU" in NO_HOST_TIER_CPU
    with pytest.raises(EngineFailed, match="cannot sleep: vLLM's host tier is its sleep mode"):
        rt.sleep()  # no port, no process: it would fail differently had it tried the engine
    with pytest.raises(EngineFailed, match="no engine is running"):
        runtime("cuda:0", tmp_path).sleep()


@pytest.mark.parametrize(("flavor", "tier"), [("cpu", VLLM_HOST_TIER_CPU), ("cuda", VLLM_HOST_TIER_CUDA)])
def test_prewarm_engines_says_what_the_vllm_host_tier_is(tmp_path: Path, flavor: str, tier: str) -> None:
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "python").write_text("")
    (tmp_path / ".prewarm-engine").write_text(f"vllm==0.32.0 x\nvllm 0.32.0 ({flavor})\n")
    st = engine_status("vllm", {"PREWARM_VLLM_VENV": str(tmp_path)})
    assert st.available and st.as_json()["host_tier"] == tier
    assert "not support" in VLLM_HOST_TIER_CPU and "wake_up" in VLLM_HOST_TIER_CUDA
    assert engine_status("vllm", {"PREWARM_VLLM_VENV": str(tmp_path / "none")}).host_tier == VLLM_HOST_TIER_CPU
    assert "host cache" in engine_status("torch").host_tier


def test_engine_records_are_written_whole_read_back_and_a_gone_engine_is_dropped(tmp_path: Path) -> None:
    recs = EngineRecords(tmp_path / "engines")
    gone = EngineRecord("abc", "n/cuda:0", "m", "v1", pid=2**22 + 12345, create_time=1.0, port=9, worker_pid=1)
    recs.add(gone)
    files = list((tmp_path / "engines").rglob("*"))
    assert [f.name for f in files if f.is_file()] == ["abc.json"]  # no temporary file left
    assert recs.records("n/cuda:0") == [gone] and recs.records("n/cuda:1") == []
    bad = tmp_path / "engines" / "n__cuda_0" / "zzz.json"
    bad.write_text("{not json")
    assert recs.records("n/cuda:0") == [gone] and not bad.exists()  # unreadable: removed, said in the log
    [(rec, line)] = recs.reap("n/cuda:0")
    assert rec == gone and "already gone" in line and recs.records("n/cuda:0") == []
    recs.remove("n/cuda:0", "abc")  # idempotent
    assert json.loads(json.dumps(gone.__dict__))["pid"] == gone.pid


def test_an_older_record_without_its_group_reads_the_launchers_pid_as_the_group(tmp_path: Path) -> None:
    recs = EngineRecords(tmp_path / "engines")
    d = tmp_path / "engines" / "n__cuda_0"
    d.mkdir(parents=True)
    (d / "old.json").write_text(json.dumps({"engine_id": "old", "gpu": "n/cuda:0", "model": "m", "version": "v1",
                                            "pid": 4321, "create_time": 1.0, "port": 9, "worker_pid": 1}))
    [rec] = recs.records("n/cuda:0")
    assert rec.pgid == 0 and rec.group == 4321


# A group leader that starts a child with an empty environment (no PREWARM_ENGINE_ID, as vLLM's renamed
# engine core shows none), then exits once its stdin closes: the child is left in the leader's group.
LEADER = ("import subprocess, sys\n"
          "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'], env={})\n"
          "sys.stdin.read()\n")


def test_reap_ends_the_recorded_session_after_its_leader_died_and_never_an_older_process(tmp_path: Path) -> None:
    leader = subprocess.Popen([sys.executable, "-c", LEADER], start_new_session=True, stdin=subprocess.PIPE)
    child = None
    try:
        created = psutil.Process(leader.pid).create_time()
        child = wait_for(lambda: [p for p in group_members(leader.pid) if p.pid != leader.pid], 30,
                         what="the leader's child")[0]
        assert ENGINE_ID_ENV not in child.environ()
        leader.communicate(timeout=30)  # the leader exits; its group (the child) stays
        recs = EngineRecords(tmp_path / "engines")
        # A record whose launcher started after the child (a wrong record: every process of an engine
        # starts after its launcher): the child is not taken for the engine.
        recs.add(EngineRecord("newer", "n/cpu:0", "m", "v1", pid=leader.pid, create_time=created + 100.0,
                              port=0, worker_pid=1, pgid=leader.pid))
        [(_, line)] = recs.reap("n/cpu:0", grace=5.0, timeout=5.0)
        assert "already gone" in line and child.is_running()
        recs.add(EngineRecord("e1", "n/cpu:0", "m", "v1", pid=leader.pid, create_time=created, port=0,
                              worker_pid=1, pgid=leader.pid))
        [(_, line)] = recs.reap("n/cpu:0", grace=5.0, timeout=5.0)
        assert f"stopped 1 leftover process(es) ({child.pid})" in line
        assert group_members(leader.pid) == [] and recs.records("n/cpu:0") == []
    finally:
        if leader.poll() is None:
            leader.kill()
            leader.wait()
        if child is not None and child.is_running():
            child.kill()


def test_a_recorded_port_someone_else_listens_on_is_said_and_left_alone(tmp_path: Path) -> None:
    recs = EngineRecords(tmp_path / "engines")
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        recs.add(EngineRecord("gone", "n/cpu:0", "m", "v1", pid=2**22 + 12345, create_time=1.0, port=port,
                              worker_pid=1))
        [(_, line)] = recs.reap("n/cpu:0")
        assert f"already gone; port {port} is held by pid {os.getpid()}, not the engine's: left alone" in line
        assert not port_is_free(port)  # still listening: nothing of ours was touched
    assert recs.records("n/cpu:0") == []


def test_cuda_graphs_plan_and_the_eager_fallback() -> None:
    assert plan(False, torch.device("cpu")) == (False, None)
    on, note = plan(True, torch.device("cpu"))
    assert not on and note and "ignored on cpu" in note
    on, note = plan(True, torch.device("cuda:0"), cuda_available=False)
    assert not on and note and "not available" in note
    assert plan(True, torch.device("cuda:0"), cuda_available=True) == (True, None)
    m = torch.nn.Linear(4, 2)
    graphs = GraphSet(m)
    x = torch.ones(3, 4)
    y, replayed = graphs.run(x, m)  # nothing captured: eager
    assert not replayed and torch.equal(y, m(x))


def test_the_cuda_graphs_flag_is_validated_and_torch_only(tmp_path: Path) -> None:
    cat = tiny_catalog(tmp_path / "m", ["tiny-lm"])
    text = cat.read_text()
    cat.write_text(text.replace('version = "v1"', 'version = "v1"\ncuda_graphs = true', 1))
    entry = load_catalog(cat).get("tiny-lm")
    assert entry.cuda_graphs is True and entry.summary()["cuda_graphs"] is True  # models list --json shows it
    cat.write_text(text.replace('version = "v1"', 'version = "v1"\ncuda_graphs = "yes"', 1))
    with pytest.raises(CatalogError, match="model 'tiny-lm': cuda_graphs 'yes' must be true or false"):
        load_catalog(cat)
    cat.write_text(text)
    assert load_catalog(cat).get("tiny-lm").cuda_graphs is False


def test_cuda_graphs_on_cpu_are_accepted_noted_and_the_replica_serves_eagerly(tmp_path: Path) -> None:
    cat = tiny_catalog(tmp_path / "m", ["tiny-lm"])
    cat.write_text(cat.read_text().replace('version = "v1"', 'version = "v1"\ncuda_graphs = true', 1))
    entry = load_catalog(cat).get("tiny-lm")
    dev = make_device(DeviceSpec("cpu:0", GiB), "n/cpu:0")
    rt = TorchRuntime(entry, dev, "n/cpu:0", policy=WarmupPolicy(min_passes=2, max_passes=3))
    rt.required_bytes()
    held = rt.load()
    figures = rt.warm()
    assert figures and all(f["cuda_graph"] is False and "ignored on cpu" in f["cuda_graph_note"] for f in figures)
    assert rt.graphs is None and rt.graph_bytes == 0 and rt.measure() == held
    answer = rt.serve({"inputs": None, "seed": 0})
    assert answer["cuda_graph"] is False and answer["output"]["finite"]
    assert rt.release() == held and rt.measure() == 0


# --- vllm: the checkpoint directory is checked inside the model roots before the engine starts ------------
def vllm_entry(tmp_path: Path) -> ModelEntry:
    """A small checkpoint directory (config, weights, tokenizer) read through a catalog as a vllm entry."""
    ck = tmp_path / "models" / "ckpt"
    ck.mkdir(parents=True)
    (ck / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": 64,
                                                "max_position_embeddings": 128}))
    save_file({"lm_head.weight": torch.zeros(64, 8)}, str(ck / "model.safetensors"))
    (ck / "tokenizer.json").write_text("{}")
    (tmp_path / "models" / "catalog.toml").write_text(
        '[[models]]\nid = "m"\nversion = "v1"\nruntime = "vllm"\npath = "ckpt"\n'
        "[[models.warmup]]\nprompt_tokens = 8\n")
    (tmp_path / "outside").mkdir()
    return load_catalog(tmp_path / "models" / "catalog.toml").get("m", "v1")


def fake_engine(tmp_path: Path) -> tuple[Path, Path]:
    """A "python" that only records it was started, then exits: a spawn leaves that mark."""
    mark = tmp_path / "engine-started"
    python = tmp_path / "fake-python"
    python.write_text(f"#!/bin/sh\ntouch {mark}\nexit 3\n")
    python.chmod(0o755)
    return python, mark


def vllm_with_roots(entry: ModelEntry, tmp_path: Path, python: Path) -> VllmRuntime:
    spec = ReplicaSpec(model=entry.id, version=entry.version, path=entry.weights, gpu="n/cpu", roots=entry.roots)
    return VllmRuntime(spec, python=python, host="127.0.0.1", log_dir=tmp_path / "logs", start_timeout=60.0)


def move_out(entry: ModelEntry, name: str) -> None:
    """The checkpoint's `name` moved out of the roots, a symlink to it left in its place (the same bytes)."""
    outside = entry.weights.parent.parent / "outside" / name
    shutil.move(entry.weights / name, outside)
    (entry.weights / name).symlink_to(outside)


@pytest.mark.parametrize("name", ["config.json", "model.safetensors", "tokenizer.json"])
def test_the_vllm_directory_check_names_a_file_symlinked_out_of_the_roots(tmp_path: Path, name: str) -> None:
    entry = vllm_entry(tmp_path)
    check_files(entry.weights, entry.roots, "m@v1 on n/cpu")  # all inside: passes
    move_out(entry, name)
    with pytest.raises(CheckpointError, match="outside the model roots") as err:
        check_files(entry.weights, entry.roots, "m@v1 on n/cpu")
    msg = str(err.value)
    assert msg.startswith("m@v1 on n/cpu: ") and f"{entry.weights / name}: resolves to" in msg
    assert str(entry.roots[0]) in msg
    check_files(entry.weights, None)  # no roots given: no boundary


@pytest.mark.parametrize("name", ["config.json", "model.safetensors", "tokenizer.json", "."])
def test_a_vllm_engine_is_not_started_on_a_checkpoint_swapped_out_of_the_roots(tmp_path: Path, name: str) -> None:
    entry = vllm_entry(tmp_path)
    python, mark = fake_engine(tmp_path)
    rt = vllm_with_roots(entry, tmp_path, python)
    assert rt.required_bytes() > 0  # sized while every file was inside (the worker reserves, then loads)
    if name == ".":  # the directory itself swapped for a symlink to a copy outside
        shutil.move(entry.weights, tmp_path / "outside" / "ckpt")
        entry.weights.symlink_to(tmp_path / "outside" / "ckpt", target_is_directory=True)
    else:
        move_out(entry, name)
    with pytest.raises(CheckpointError, match="outside the model roots") as err:
        rt.load()
    assert (f"{entry.weights / name}" if name != "." else f"{entry.weights}: resolves to") in str(err.value)
    assert not mark.exists() and rt.proc is None and rt.log_path is None  # refused before any process


def test_a_vllm_checkpoint_inside_the_roots_reaches_the_engine_start(tmp_path: Path) -> None:
    """The control for the test above: the same runtime with every file inside does spawn its engine."""
    entry = vllm_entry(tmp_path)
    python, mark = fake_engine(tmp_path)
    rt = vllm_with_roots(entry, tmp_path, python)
    with pytest.raises(EngineFailed, match="exited with status 3 before it was healthy"):
        rt.load()
    assert mark.exists() and rt.proc is None  # started, then stopped on the failure


@pytest.mark.parametrize("device", ["cpu", "cuda:0"])
def test_a_base_with_adapters_runs_with_lora_and_its_runtime_api_one_without_does_not(
        tmp_path: Path, device: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from gpu_worker.runtimes.vllm_engine import LoraSlots

    monkeypatch.delenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING", raising=False)
    plain = runtime(device, tmp_path)
    assert "--enable-lora" not in plain.command(Path("/venv/bin/python"), 8123)
    assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING" not in plain.environment()
    rt = runtime(device, tmp_path)
    rt.lora = LoraSlots(max_loras=3, max_cpu_loras=6, max_lora_rank=32)
    cmd = rt.command(Path("/venv/bin/python"), 8123)
    i = cmd.index("--enable-lora")
    assert cmd[i:i + 7] == ["--enable-lora", "--max-loras", "3", "--max-cpu-loras", "6", "--max-lora-rank", "32"]
    assert rt.environment()["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"


def test_an_adapter_is_not_loaded_into_an_engine_that_is_not_running_or_has_no_lora(tmp_path: Path) -> None:
    from gpu_worker.demo_hf import tiny_llama_config
    from gpu_worker.demo_lora import write_lora_adapter
    from gpu_worker.runtimes.vllm_adapter import VllmAdapterRuntime
    from gpu_worker.runtimes.vllm_engine import LoraSlots

    write_lora_adapter(tmp_path / "lora", tiny_llama_config(), rank=8)
    spec = ReplicaSpec(model="lora", version="v1", path=tmp_path / "lora", gpu="n/cpu", roots=(tmp_path,))
    engine = runtime("cpu", tmp_path)
    adapter = VllmAdapterRuntime(spec, engine, "m@v1")
    assert adapter.required_bytes() > 0 and adapter.measure() == 0 and adapter.endpoint is None
    with pytest.raises(EngineFailed, match="cannot load the adapter: its base m@v1's engine is not running"):
        adapter.load()
    engine.proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    engine.port = 1
    try:
        with pytest.raises(EngineFailed, match="was started without LoRA"):
            adapter.load()
        engine.lora = LoraSlots(2, 2, 16)
        assert adapter.died() is None and adapter.release() == 0  # never loaded: nothing to unload
    finally:
        engine.proc.kill()
        engine.proc.wait()
