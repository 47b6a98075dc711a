"""bench.victim_order: prewarm beside prewarm with a clairvoyant victim order, and the victims' next requests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GIB = 1 << 30


def test_the_clairvoyant_order_evicts_the_model_asked_for_last(tmp_path: Path) -> None:
    """One GPU holds two of three 30 GiB models. a is asked for every 5 s until 95 s, then not until 3,000 s; b once
    at 10 s and again at 105 s; c arrives at 100 s and needs a victim. prewarm's own order values a's recent rate and
    evicts b, which comes back cold at 105 s; the clairvoyant order evicts a (asked for again last), so b stays warm:
    fewer cold starts, and no victim of it has a neighbour on its GPU that is asked for later."""
    (tmp_path / "profile.csv").write_text("model,size_bytes,load_seconds\n"
                                          + "".join(f"{m},{30 * GIB},2.0\n" for m in "abc"))
    rows = sorted([(t, "a") for t in range(0, 96, 5)] + [(10, "b"), (100, "c"), (105, "b"), (3000, "a")])
    (tmp_path / "requests.csv").write_text("timestamp,model\n" + "".join(f"{t},{m}\n" for t, m in rows))
    out = subprocess.run([sys.executable, "-m", "bench.victim_order", str(tmp_path), "--gpus", "1", "--json"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PREWARM_PURE_POLICY": "1"})
    assert out.returncode == 0, out.stderr
    own, clairvoyant = json.loads(out.stdout)["runs"]
    assert own["policy"] == "prewarm" and clairvoyant["policy"] == "prewarm-clairvoyant-order"
    assert own["later_share_mean"] > 0.0  # prewarm's own order takes b here: the scenario tells the two orders apart
    assert clairvoyant["with_choice"] >= 1 and clairvoyant["later_share_mean"] == 0.0
    assert clairvoyant["cold_starts"] < own["cold_starts"]


def test_a_folder_without_a_trace_is_refused_with_what_it_needs(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "bench.victim_order", str(tmp_path)], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "neither invocations.csv nor requests.csv" in out.stderr
