"""A warmup's memory counts against the device (gpu_worker/runtimes/warmup_memory.py): an input whose memory
would pass what the GPU has free is not warmed, and the replica goes ready without it. A real tiny torch
model from real safetensors, in-process worker, real Redis, a CPU device of a small budget."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import redis

from gpu_worker.demo_models import catalog_entry, write_weights
from prewarm import events, state
from tests.model_files import small_model
from tests.system.test_worker_residency import gpu_state, make_worker, replica

MiB = 2**20


def mlp_catalog(folder: Path, warmups: dict[str, list[list[int]]]) -> Path:
    """tiny-mlp's real weights (in 64, hidden 128) under each id, warmed with the given float32 shapes."""
    folder.mkdir(parents=True, exist_ok=True)
    base = small_model("tiny-mlp")
    weights = write_weights(base, folder / "tiny-mlp")
    parts = [catalog_entry(dataclasses.replace(base, id=mid, warmup=[{"shape": s, "dtype": "float32"} for s in shapes]),
                           f"tiny-mlp/{weights}") for mid, shapes in warmups.items()]
    (folder / "catalog.toml").write_text("\n".join(parts))
    return folder / "catalog.toml"


def _not_warmed(r: redis.Redis, cat: Path, model: str, entry: int, *needles: str) -> str:
    """Preload `model` next to a resident one on a 2 MiB device: its warmup input #entry does not fit, so it is
    not warmed (the needles in its words) and the replica goes ready without it, never having held more than
    the device has free; only its module stays counted, the GPU still serves, and the ready event says so."""
    w = make_worker(r, cat, devices="cpu:0=2MiB")
    g = w.gpu_for("cpu:0")
    resident = w.preload(g, "small")
    assert resident["warmup"][0]["peak_bytes"] > 0
    state.claim_intent(r, state.Intent("preload", model, "v1", g.id, "operator", "t", time.time(), time.time() + 60))
    out = w.preload(g, model)
    fig = out["warmup"][entry]
    assert fig["passes"] == 0 and fig["peak_bytes"] == 0
    msg = fig["not_warmed"]
    for n in needles:
        assert n in msg, f"{n!r} not in {msg!r}"
    # Its warmup's reservations are gone: the device counts the two modules, as the GPU record says.
    assert g.device.inventory().used_bytes == resident["bytes"] + out["bytes"] == gpu_state(r, g.id).used_bytes
    rep = replica(r, g.id, model)
    assert rep is not None and rep.state == "ready"
    ready = events.read(r, kind="ready", model=model)[0]
    assert f"#{entry} not warmed" in ready.reason and ready.numbers["warmup_not_warmed"] == [entry]
    assert w.infer(g, "small")["output"]["finite"] and w.infer(g, model)["output"]["finite"]
    return msg


def test_a_warmup_input_larger_than_the_free_budget_is_not_made(r: redis.Redis, tmp_path: Path) -> None:
    # [16384, 64] float32: 4 MiB of input, within the catalog's bound, past a 2 MiB device.
    cat = mlp_catalog(tmp_path / "m", {"small": [[1, 64]], "big-input": [[1, 64], [16384, 64]]})
    msg = _not_warmed(r, cat, "big-input", 1,
                      "big-input@v1 on node-t/cpu:0: warmup input #1 (shape [16384, 64], float32)",
                      "its input would need 4.0 MiB (4194304 bytes)", "free of 2.0 MiB",
                      "the warmup's memory counts against the device", "declare a smaller warmup input")
    assert "activations" not in msg


def test_a_warmup_whose_activations_pass_the_free_budget_is_stopped_while_it_runs(r: redis.Redis,
                                                                                    tmp_path: Path) -> None:
    # [2048, 64] float32: a 512 KiB input that fits, but each hidden activation is 2048 x 128 x 4 = 1 MiB
    # and the residual MLP holds more than one at a time: past what is left of 2 MiB.
    cat = mlp_catalog(tmp_path / "m", {"small": [[1, 64]], "wide-batch": [[2048, 64]]})
    _not_warmed(r, cat, "wide-batch", 0, "wide-batch@v1 on node-t/cpu:0: warmup input #0 (shape [2048, 64], float32)",
                "its first pass's activations passed the", "GPU node-t/cpu:0 has free of 2.0 MiB",
                "besides its input (512.0 KiB), and the pass was stopped there", "declare a smaller warmup input")


def test_a_warmup_that_fits_reports_its_peak_and_leaves_only_the_module_counted(r: redis.Redis,
                                                                                  tmp_path: Path) -> None:
    cat = mlp_catalog(tmp_path / "m", {"ok": [[1, 64], [256, 64]]})
    w = make_worker(r, cat, devices="cpu:0=16MiB")
    g = w.gpu_for("cpu:0")
    out = w.preload(g, "ok")
    one, batch = out["warmup"]
    # The input's bytes plus the activations measured: at least one hidden activation (x 128 x 4 bytes).
    assert batch["peak_bytes"] >= 256 * 64 * 4 + 256 * 128 * 4 > one["peak_bytes"] >= 64 * 4 + 128 * 4
    # Once warm only the module is held: the warmup's reservations are gone, the bytes are the weights'.
    assert g.device.inventory().used_bytes == out["bytes"] == gpu_state(r, g.id).used_bytes
    assert not batch["cut_short"]
