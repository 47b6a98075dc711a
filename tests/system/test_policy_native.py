"""The policy's native (mypyc) build: it decides exactly as the pure-Python source does, and a build
that cannot be loaded is ignored (the pure-Python modules run) rather than failing the import."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

import numpy as np
import pytest

from prewarm.domain.policy import native

ROOT = Path(__file__).resolve().parents[2]


def _trace(path: Path) -> None:
    """Three hours of 150 models: periodic ones (hot segments: speculative loads), bursty ones and a
    long tail, on a fleet too small for them (evictions, make-room, staging)."""
    rng = np.random.default_rng(7)
    minutes = 180
    rows = ["HashOwner,HashApp,HashFunction," + ",".join(str(i) for i in range(1, minutes + 1))]
    for k in range(150):
        if k % 3 == 0:  # every `period` minutes, a few requests
            period = 3 + k % 17
            counts = [(2 + k % 3) if (i + k) % period == 0 else 0 for i in range(minutes)]
        elif k % 3 == 1:  # bursts
            counts = (rng.random(minutes) < 0.05) * rng.poisson(20, minutes)
        else:  # rare
            counts = rng.poisson(0.02, minutes)
        rows.append(f"o,a,f{k}," + ",".join(str(int(c)) for c in counts))
    path.write_text("\n".join(rows) + "\n")


def _simulate(trace: Path, out: Path, pure: bool, extra: tuple[str, ...] = ()) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PREWARM_PURE_POLICY"}
    if pure:
        env["PREWARM_PURE_POLICY"] = "1"
    proc = subprocess.run(
        [sys.executable, "-m", "simulator", str(trace), "--gpus", "2", "--gpu-memory", "24GiB",
         "--host-memory", "48GiB", "--policies", "prewarm", "--json", str(out), *extra],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    return json.loads(out.read_text())


def test_native_build_decides_exactly_like_the_source(tmp_path) -> None:
    """With the no-regret layer off (prewarm's own order alone: the paths the layer does not take)."""
    if native.active() is None:
        pytest.skip("no native policy build for these sources (python -m prewarm.domain.policy build)")
    trace = tmp_path / "inv.csv"
    _trace(trace)
    off = ("--no-regret", "off")
    pure = _simulate(trace, tmp_path / "pure.json", pure=True, extra=off)
    compiled = _simulate(trace, tmp_path / "native.json", pure=False, extra=off)
    assert (pure["policy_build"], compiled["policy_build"]) == ("python", "native")
    a, b = pure["policies"]["prewarm"], compiled["policies"]["prewarm"]
    a.pop("runtime_s")
    b.pop("runtime_s")
    # the trace exercises the policy's paths: demand, speculative loads, evictions, staging
    assert a["cold_starts"] > 0 and a["loads"] > a["cold_starts"] // 2
    assert a["evictions"] > 0 and a["stages"] > 0
    assert a == b


def test_native_build_decides_exactly_like_the_source_with_the_no_regret_layer_on(tmp_path) -> None:
    """The layer (experts.py, duels.py; on by default) is compiled with the rest: the same ghosts, the same
    duels, the same leader, the same victims."""
    if native.active() is None:
        pytest.skip("no native policy build for these sources (python -m prewarm.domain.policy build)")
    trace = tmp_path / "inv.csv"
    _trace(trace)
    on = ("--no-regret", "on")
    pure = _simulate(trace, tmp_path / "pure.json", pure=True, extra=on)
    compiled = _simulate(trace, tmp_path / "native.json", pure=False, extra=on)
    a, b = pure["policies"]["prewarm"], compiled["policies"]["prewarm"]
    a.pop("runtime_s")
    b.pop("runtime_s")
    # the duels ran: every other expert's order sorted the victims of each eviction, and requests settled them
    assert a["experts"]["duels"]["settled"] > 0 and a["evictions"] > 0
    assert a == b


def test_a_build_that_does_not_load_is_ignored(tmp_path) -> None:
    """A build directory for these very sources whose modules are garbage (a different interpreter,
    a truncated copy): the import falls back to the sources and says so."""
    env = {k: v for k, v in os.environ.items() if k != "PREWARM_PURE_POLICY"}
    env["PREWARM_NATIVE_DIR"] = str(tmp_path)
    d = tmp_path / native.source_hash()
    (d / "pkg").mkdir(parents=True)
    (d / "rt").mkdir()
    for m in native.MODULES:
        (d / "pkg" / f"{m}{EXTENSION_SUFFIXES[0]}").write_bytes(b"not a shared object")
    (d / "complete").write_text("x\n")
    code = ("import prewarm.domain.policy as p, prewarm.domain.policy.planner as pl; "
            "print(p.native.active(), pl.__file__.endswith('planner.py'))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["None", "True"]
    assert "ignoring the native policy build" in proc.stderr


def test_pure_python_can_be_forced(tmp_path) -> None:
    env = {**os.environ, "PREWARM_PURE_POLICY": "1"}
    code = "import prewarm.domain.policy.planner as pl; print(pl.__file__)"
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(ROOT / "prewarm" / "domain" / "policy" / "planner.py")


def test_the_compiled_modules_type_check(tmp_path) -> None:
    """mypyc compiles only what mypy accepts: a policy edit that stops type-checking would leave
    every later run on the slower pure-Python policy (the build just fails with a note)."""
    paths = [f"prewarm/domain/policy/{m}.py" for m in native.MODULES]
    proc = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path / "cache"), *paths],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr

