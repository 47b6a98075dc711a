"""The worker's bookkeeping of vLLM's CUDA host tier (gpu_worker/sleeping_engines.py) on this CPU machine.

vLLM's sleep mode needs CUDA, so the engine here is a stand-in with VllmRuntime's host-tier surface
(host_tier, sleep, a load that wakes it, release); everything around it is real: the NodeWorker, its
device accounting, Redis and the published node record. The real engine's sleep/wake_up is checked where
a GPU is lent; the command, environment and CPU refusal are in tests/unit/test_engine_guards.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import redis

from gpu_worker.residency import NodeWorker, WorkerOptions
from prewarm import state
from prewarm.config import parse_devices
from tests.system.test_worker_runtimes import catalog_for


class SleepyEngine:
    """VllmRuntime's protocol and host tier, without a process: 4000 bytes awake, 100 asleep."""

    name = "vllm"
    remeasure_seconds = None
    endpoint = "http://127.0.0.1:1/v1"

    def __init__(self) -> None:
        self.asleep, self.source, self.weights_bytes, self.released = False, "storage", 1000, 0

    def host_tier(self) -> str | None:
        return None

    def sleep(self) -> int:
        self.asleep = True
        return 100

    def required_bytes(self) -> int:
        return 5000

    def load(self, progress: Any = None, check_cancel: Any = None) -> int:
        self.source, self.asleep = ("host" if self.asleep else "storage"), False
        return 4000

    def warm(self, check_cancel: Any = None) -> list[dict[str, Any]]:
        return [{"passes": 1}]

    def measure(self) -> int:
        return 100 if self.asleep else 4000

    def died(self) -> str | None:
        return None

    def serve(self, request: dict[str, Any]) -> dict[str, Any]:
        return {}

    def release(self) -> int:
        self.released += 1
        return self.measure()


def test_stage_puts_a_ready_engine_to_sleep_a_preload_wakes_it_and_unstage_stops_it(r: redis.Redis,
                                                                                      tmp_path: Path) -> None:
    cat = catalog_for(tmp_path / "models", "vllm")
    w = NodeWorker(r, cat, "node-s", parse_devices("cpu:0=8GiB"), WorkerOptions(heartbeat_ttl=30))
    g = w.gpu_for("cpu:0")
    engine = SleepyEngine()
    # The lifecycle's choice for a vllm entry (a sleeping engine on this GPU first), with the stand-in.
    w._runtime = lambda g_, e: w.take_sleeper(e.key, g_) or engine  # type: ignore[method-assign]
    out = w.preload(g, "tiny-chat")
    assert out["state"] == "ready" and out["source"] == "storage" and g.device.inventory().used_bytes == 4000

    st = w.stage("tiny-chat")
    assert st["state"] == "staged" and st["tier"] == "engine sleep" and st["gpu"] == g.id and not st["noop"]
    assert g.replicas == {} and g.device.inventory().used_bytes == 100  # only what it holds asleep
    assert engine.asleep and engine.released == 0  # the process is kept
    w.heartbeat()
    fleet = state.read_fleet(r).gpu(g.id)
    assert fleet is not None and fleet.replicas == [] and fleet.used_bytes == 100  # not routable
    [staged] = state.read_staged(r)["node-s"]
    assert (staged.model, staged.state, staged.bytes) == ("tiny-chat", "staged", 1000)
    assert f"asleep on {g.id}" in (staged.reason or "")
    assert w.stage("tiny-chat")["noop"]

    out = w.preload(g, "tiny-chat")  # the promotion: the same engine woken
    assert out["state"] == "ready" and out["source"] == "host" and not engine.asleep
    assert g.device.inventory().used_bytes == 4000 and w.node_state()[1] == []

    w.stage("tiny-chat")
    un = w.unstage("tiny-chat")
    assert un["versions"] == ["v1"] and un["bytes_freed"] == 1000 and not un["noop"]
    assert engine.released == 1 and g.device.inventory().used_bytes == 0 and w.node_state()[1] == []
    w.shutdown()
