"""Every trace reader (the simulator's `read_trace`, `prewarm replay`'s, the stream view) follows one set of rules
(prewarm.domain.trace_format): a file one takes the others take, and one they refuse each refuses with the same
words, naming the file and line. Before, a NaN or infinite timestamp ran the simulator without end and a request
with no model was simulated as model ''; an empty count cell was 0 to replay and the stream view but refused by
the simulator."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from prewarm.programs.replay import load_azure_minutes, load_requests_csv
from simulator.cli import main as cli_main
from simulator.stream_view import write_view
from simulator.trace import read_trace

HEAD = "HashOwner,HashApp,HashFunction,minute_1,minute_2,minute_3,minute_4,minute_5\n"


def _readers(path: Path, out: Path) -> dict[str, object]:
    return {
        "simulator": lambda: read_trace(path),
        "replay": lambda: load_azure_minutes(path, ["m"], random.Random(0), min_active=1),
        "stream view": lambda: write_view(path, out, top=5, every=1),
    }


@pytest.mark.parametrize(("text", "says"), [
    (HEAD + "o,a,f,1,x,0,0,1\n", "'x' is not a request count"),
    (HEAD + "o,a,f,1,-2,0,0,1\n", "a request count is negative (-2)"),
    (HEAD + "o,a,f,1,1.5,0,0,1\n", "'1.5' is not a request count"),
    (HEAD + "o,a,f,1,1\n", "line 2: 5 fields where the header has 8"),
    ("HashFunction,minute_1,when\nf,1,2\n", "column 'when' is neither a minute"),
    ("HashFunction,Trigger\nf,http\n", "no minute columns in the header"),
])
def test_every_azure_minute_reader_refuses_the_same_file_with_the_same_words(tmp_path: Path, text: str,
                                                                             says: str) -> None:
    path = tmp_path / "inv.csv"
    path.write_text(text)
    for name, read in _readers(path, tmp_path / "view").items():
        with pytest.raises(ValueError) as err:
            read()  # type: ignore[operator]
        assert says in str(err.value), name
        assert str(path) in str(err.value), name
    assert not (tmp_path / "view").exists()  # the view wrote nothing


def test_an_empty_count_cell_is_no_requests_to_every_reader(tmp_path: Path) -> None:
    path = tmp_path / "inv.csv"
    path.write_text(HEAD + "o,a,f,2,,1,,3\no,a,g,,,,,1\n")
    tr = read_trace(path)
    assert tr.models == ["f", "g"] and tr.requests == 7
    assert np.bincount(tr.mids).tolist() == [6, 1]
    replayed = load_azure_minutes(path, ["busiest"], random.Random(0), min_active=3)  # f: active in 3 minutes
    assert len(replayed) == 6 and [int(r.t // 60) for r in replayed] == [0, 0, 2, 4, 4, 4]
    assert write_view(path, tmp_path / "view", top=1, every=1) == 1
    assert read_trace(tmp_path / "view" / "invocations.csv").requests == 6  # the view's copy reads the same


@pytest.mark.parametrize(("rows", "says"), [
    ("1.0,f\nnan,g\n", "line 3: timestamp 'nan' is not a finite time"),
    ("1.0,f\ninf,g\n", "line 3: timestamp 'inf' is not a finite time"),
    ("1.0,f\n5,\n", "line 3: a request needs a model"),
    ("1.0,f\nlater,g\n", "line 3: timestamp 'later' is neither seconds nor an ISO 8601 time"),
])
def test_every_requests_reader_refuses_a_request_it_cannot_place(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                  rows: str, says: str) -> None:
    path = tmp_path / "requests.csv"
    path.write_text("timestamp,model\n" + rows)
    for read in (lambda: read_trace(path, "requests"), lambda: load_requests_csv(path)):
        with pytest.raises(ValueError, match=says):
            read()
    # the simulator's command says so and stops (a NaN time ran it without end before)
    assert cli_main(["simulate", str(path), "--format", "requests", "--gpus", "1", "--policies",
                     "on-demand-lru"]) == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err


def test_the_requests_readers_agree_on_a_good_file(tmp_path: Path) -> None:
    path = tmp_path / "requests.csv"
    path.write_text("timestamp,model,extra\n2026-12-07T10:00:02Z,b,x\n2026-12-07T10:00:00+00:00,a,y\n"
                    "1796637603.5,a,z\n")
    tr = read_trace(path, "requests")
    got = load_requests_csv(path)
    assert [(round(r.t, 3), r.model) for r in got] == [(0.0, "a"), (2.0, "b"), (3.5, "a")]
    assert [round(float(t), 3) for t in tr.times] == [r.t for r in got]
    assert [tr.models[i] for i in tr.mids] == [r.model for r in got]


def test_a_negative_seed_is_refused_naming_the_option(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "inv.csv"
    path.write_text(HEAD + "o,a,f,2,0,1,0,3\n")
    with pytest.raises(ValueError, match="--seed must be a whole number of at least 0, got -1"):
        read_trace(path, seed=-1)
    assert cli_main(["simulate", str(path), "--seed", "-1", "--gpus", "1", "--policies", "on-demand-lru"]) == 2
    assert "simulate: --seed must be a whole number of at least 0, got -1" in capsys.readouterr().err
    assert read_trace(path, seed=3).requests == 6


def test_a_trace_spanning_past_a_year_is_refused_unless_cut(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Seconds and milliseconds mixed in one file: replayed, the 57,000-year span ran without end."""
    path = tmp_path / "requests.csv"
    path.write_text("timestamp,model\n1796637600,f\n1796637600000,g\n1796637601,f\n")
    with pytest.raises(ValueError, match="spans 20,773,622 days, past the 366 a replay takes"):
        read_trace(path, "requests")
    assert cli_main(["simulate", str(path), "--format", "requests", "--gpus", "1", "--policies", "on-demand-lru"]) == 2
    assert "are seconds and milliseconds mixed?" in capsys.readouterr().err
    cut = read_trace(path, "requests", hours=1)  # its first hour replays
    assert cut.requests == 2 and cut.span_s == 3600
    with pytest.raises(ValueError, match="spans 20,773,622 days"):  # prewarm replay would have slept for ever
        load_requests_csv(path)
    azure = tmp_path / "inv.csv"
    azure.write_text("HashFunction,minute_1,minute_999999999\nf,1,1\n")  # a minute column's typo
    for name, read in _readers(azure, tmp_path / "view").items():
        if name == "stream view":
            continue  # it copies rows, replaying nothing
        with pytest.raises(ValueError, match="spans 694,444 days"):
            read()  # type: ignore[operator]
