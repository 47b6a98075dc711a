"""simulator.stream_view: the small-model view of a per-minute trace (issue 26's unseen-traffic check)."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from simulator.stream_view import main, write_view
from simulator.trace import GIB, default_load_seconds, load_profile, read_trace

HEADER = ["HashOwner", "HashApp", "HashFunction", "Trigger", "1", "2", "3"]


def trace(path: Path, rows: list[tuple[str, list[str]]]) -> Path:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(HEADER)
        for name, counts in rows:
            w.writerow(["o", "a", name, "http", *counts])
    return path


def test_it_keeps_every_nth_of_the_busiest_rows_as_they_are_with_seeded_small_sizes(tmp_path) -> None:
    src = trace(tmp_path / "in.csv", [("quiet", ["0", "1", ""]), ("busiest", ["9", "9", "9"]),
                                      ("second", ["5", "5", "5"]), ("third", ["3", "3", "3"]),
                                      ("fourth", ["2", "2", "2"]), ("fifth", ["1", "1", "1"])])
    assert write_view(src, tmp_path / "a", top=4, every=2) == 2
    tr = read_trace(tmp_path / "a" / "invocations.csv")
    assert tr.models == ["busiest", "third"] and tr.requests == 27 + 9  # the 1st and 3rd busiest, counts kept
    sizes, loads = load_profile(tmp_path / "a" / "profile.csv", tr.models)
    assert all(2 * GIB <= s <= 7 * GIB for s in sizes)
    assert list(loads) == [pytest.approx(default_load_seconds(int(s)), abs=1e-3) for s in sizes]
    # seeded by the model's name: the same sizes again, whatever else the view holds
    write_view(src, tmp_path / "b", top=1, every=1)
    assert (tmp_path / "b" / "profile.csv").read_text().splitlines()[1] == \
        (tmp_path / "a" / "profile.csv").read_text().splitlines()[1]


def test_bad_input_is_refused_with_what_to_fix(tmp_path, capsys) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("model,count\nx,1\n")
    with pytest.raises(ValueError, match="no HashFunction column"):
        write_view(bad, tmp_path / "out")
    junk = trace(tmp_path / "junk.csv", [("a", ["1", "x", "2"])])
    with pytest.raises(ValueError, match=r"junk.csv, line 2: 'x' is not a request count"):
        write_view(junk, tmp_path / "out")
    with pytest.raises(ValueError, match="min_gib <= max_gib"):
        write_view(trace(tmp_path / "ok.csv", [("a", ["1", "1", "1"])]), tmp_path / "out", min_gib=7, max_gib=2)
    assert not (tmp_path / "out").exists()  # nothing half-written
    assert main([str(tmp_path / "missing.csv"), str(tmp_path / "out")]) == 2
    assert "stream_view:" in capsys.readouterr().err
