"""bench.clairvoyance: prewarm beside prewarm with a part of its plan read from the trace's future."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GIB = 1 << 30


def _bench(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "bench.clairvoyance", str(folder), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, env={**os.environ, "PREWARM_PURE_POLICY": "1"})


def test_each_clairvoyant_part_evicts_the_model_asked_for_last(tmp_path: Path) -> None:
    """One GPU holds two of three 30 GiB models. a is asked for every 5 s until 95 s, then not until 3,000 s; b once
    at 10 s and again at 105 s; c arrives at 100 s and needs a victim. prewarm's own plan values a's recent rate and
    evicts b, which comes back cold at 105 s; made clairvoyant in its order, or in its values (the next request's
    time, or the next windows' counts), it evicts a (asked for again last), so b stays warm: fewer cold starts, and
    no victim has a neighbour on its GPU that is asked for later."""
    (tmp_path / "profile.csv").write_text("model,size_bytes,load_seconds\n"
                                          + "".join(f"{m},{30 * GIB},2.0\n" for m in "abc"))
    rows = sorted([(t, "a") for t in range(0, 96, 5)] + [(10, "b"), (100, "c"), (105, "b"), (3000, "a")])
    (tmp_path / "requests.csv").write_text("timestamp,model\n" + "".join(f"{t},{m}\n" for t, m in rows))
    out = _bench(tmp_path, "--gpus", "1", "--json")
    assert out.returncode == 0, out.stderr
    own, *seeing = json.loads(out.stdout)["runs"]
    assert own["policy"] == "prewarm" and [r["policy"] for r in seeing] == ["prewarm+order", "prewarm+next",
                                                                            "prewarm+window"]
    assert own["later_share_mean"] > 0.0  # prewarm's own plan takes b here: the scenario tells them apart
    for r in seeing:
        assert r["with_choice"] >= 1 and r["later_share_mean"] == 0.0, r
        assert r["cold_starts"] < own["cold_starts"], r


def test_bad_input_is_refused_with_what_it_needs(tmp_path: Path) -> None:
    out = _bench(tmp_path)
    assert out.returncode != 0 and "neither invocations.csv nor requests.csv" in out.stderr
    (tmp_path / "requests.csv").write_text("timestamp,model\n0,a\n")
    out = _bench(tmp_path, "--variants", "order,psychic")
    assert out.returncode != 0 and "--variants takes order, next, window" in out.stderr
