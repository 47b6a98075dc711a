"""The `vllm` runtime with a real vLLM engine on CPU serving the tiny demo Llama.

Needs the engine's environment (`prewarm engines install vllm`, scripts/install-vllm.sh); without it these
tests skip and say so. Each start of the engine takes tens of seconds on two cores.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from gpu_worker.demo_hf import write_tiny_llama
from gpu_worker.errors import LoadFailed
from gpu_worker.runtimes import ReplicaSpec, Runtime, TokenWarmup
from gpu_worker.runtimes.errors import EngineFailed
from gpu_worker.runtimes.vllm_engine import VllmRuntime, group_members, port_is_free
from gpu_worker.runtimes.warmup import WarmupPolicy
from prewarm.engines import vllm_python, vllm_venv
from tests.procs import REPO, wait_for

pytestmark = pytest.mark.skipif(
    vllm_python() is None,
    reason=f"the vLLM engine is not installed at {vllm_venv()}: run `prewarm engines install vllm` "
           "(scripts/install-vllm.sh) to run these tests")

START_TIMEOUT = 900.0  # a cold engine start on a busy two-core machine


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("vllm") / "tiny-llama", seed=2)


def spec(path: Path) -> ReplicaSpec:
    return ReplicaSpec(model="tiny-llama", version="v1", path=path, gpu="node/cpu:0",
                       warmup=(TokenWarmup(16, 1), TokenWarmup(64, 2)),
                       policy=WarmupPolicy(min_passes=3, max_passes=6, max_seconds=10.0))


@pytest.fixture
def runtimes(tmp_path: Path) -> Iterator[list[VllmRuntime]]:
    made: list[VllmRuntime] = []
    yield made
    for rt in made:  # a failed assertion must not leave an engine behind
        rt.release()


def post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


def test_engine_goes_healthy_answers_at_its_endpoint_and_is_released(checkpoint: Path, tmp_path: Path,
                                                                      runtimes: list[VllmRuntime]) -> None:
    rt = VllmRuntime(spec(checkpoint), host="127.0.0.1", log_dir=tmp_path, start_timeout=START_TIMEOUT)
    runtimes.append(rt)
    assert isinstance(rt, Runtime)
    need = rt.required_bytes()
    assert need == (checkpoint / "model.safetensors").stat().st_size - _header_bytes(checkpoint) + (256 << 20)
    seen: list[tuple[int, int]] = []
    held = rt.load(progress=lambda done, total: seen.append((done, total)))
    assert seen[-1] == (need, need)
    assert held > 0 and rt.endpoint == f"http://127.0.0.1:{rt.port}/v1"
    figures = rt.warm()
    assert [(f["prompt_tokens"], f["batch"]) for f in figures] == [(16, 1), (64, 2)]
    assert all(f["passes"] >= 3 for f in figures)

    # A router's view: the OpenAI API at the endpoint, the model served under its catalog id.
    models = json.loads(urllib.request.urlopen(f"{rt.endpoint}/models", timeout=30).read())
    assert [m["id"] for m in models["data"]] == ["tiny-llama"]
    answer = post(f"{rt.endpoint}/completions", {"model": "tiny-llama", "prompt": "Hello, world", "max_tokens": 8,
                                                  "temperature": 0, "ignore_eos": True})
    assert answer["usage"]["completion_tokens"] == 8 and answer["choices"][0]["text"]
    served = rt.serve({"prompt": "Hello, world", "max_tokens": 8, "temperature": 0, "ignore_eos": True})
    assert served["text"] == answer["choices"][0]["text"]  # greedy: the same tokens either way

    pgid, port = rt.pgid, rt.port
    assert pgid is not None and port is not None and len(group_members(pgid)) >= 2  # launcher + engine
    assert rt.release() >= held * 0.5
    assert group_members(pgid) == [] and port_is_free(port)
    assert rt.endpoint is None and rt.measure() == 0 and rt.release() == 0


def test_port_taken_fails_with_the_engines_reason_and_leaves_nothing(checkpoint: Path, tmp_path: Path,
                                                                      runtimes: list[VllmRuntime]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        rt = VllmRuntime(spec(checkpoint), host="127.0.0.1", port=port, log_dir=tmp_path,
                         start_timeout=START_TIMEOUT)
        runtimes.append(rt)
        rt.required_bytes()
        with pytest.raises(EngineFailed, match="exited with status") as err:
            rt.load()
    assert isinstance(err.value, LoadFailed)
    assert "address already in use" in err.value.log_tail.lower()  # the engine's own words
    assert "last lines of the engine's log" in str(err.value)
    assert rt.proc is None and rt.endpoint is None
    assert not [p for p in psutil.process_iter() if "vllm.entrypoints.openai.api_server" in _cmdline(p)
                and str(port) in _cmdline(p)]  # no engine process for that port anywhere


HOLDER = textwrap.dedent("""
    import json, sys, time
    from pathlib import Path
    from gpu_worker.runtimes import ReplicaSpec
    from gpu_worker.runtimes.vllm_engine import VllmRuntime
    rt = VllmRuntime(ReplicaSpec(model="tiny-llama", version="v1", path=Path(sys.argv[1])), host="127.0.0.1",
                     log_dir=sys.argv[2], start_timeout=float(sys.argv[3]))
    rt.load()
    print(json.dumps({"pgid": rt.pgid, "port": rt.port, "endpoint": rt.endpoint}), flush=True)
    time.sleep(3600)
""")


def test_a_sigkilled_worker_leaves_no_engine(checkpoint: Path, tmp_path: Path) -> None:
    out = tmp_path / "holder.out"
    with out.open("w") as f:
        worker = subprocess.Popen([sys.executable, "-c", HOLDER, str(checkpoint), str(tmp_path), str(START_TIMEOUT)],
                                  cwd=REPO, stdout=f, stderr=subprocess.STDOUT)
    pgid = None
    try:
        line = wait_for(lambda: worker.poll() is None and out.read_text().strip().startswith("{")
                        and out.read_text(), START_TIMEOUT + 60, interval=0.5, what="the engine to become healthy",
                        log=out.read_text)
        info = json.loads(line.strip().splitlines()[-1])
        pgid = info["pgid"]
        answer = post(f"{info['endpoint']}/completions", {"model": "tiny-llama", "prompt": "Hi", "max_tokens": 2})
        assert answer["usage"]["completion_tokens"] >= 1
        members = group_members(pgid)
        assert len(members) >= 3, [_cmdline(p) for p in members]  # launcher, API server, engine core
        worker.send_signal(signal.SIGKILL)
        worker.wait(30)
        wait_for(lambda: not group_members(pgid), 60, interval=0.2, what="the engine to die with its worker")
        wait_for(lambda: port_is_free(info["port"]), 30, interval=0.2, what="the engine's port to be free")
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
        if pgid is not None:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _header_bytes(path: Path) -> int:
    raw = (path / "model.safetensors").read_bytes()[:8]
    return 8 + int.from_bytes(raw, "little")


def _cmdline(p: object) -> list[str]:
    try:
        return p.cmdline()  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001
        return []
