"""Command-line input the programs cannot use is refused with a line that says what to fix, before anything is
sent (no traceback): `prewarm replay`'s trace (the file and the line), `prewarm events --limit`. A well-formed trace
reads as before."""

from __future__ import annotations

import argparse
import random
from pathlib import Path

import pytest

from prewarm.programs.replay import Request, load_azure_minutes, load_requests_csv, register

AZURE = "HashFunction,minute_1,minute_2,minute_3,minute_4,minute_5,minute_6\n"


@pytest.mark.parametrize(("fmt", "text", "says"), [
    ("azure-minute", "a,b\n1,2\n", "no minute columns in the header"),
    ("azure-minute", "", "no minute columns in the header"),
    ("azure-minute", AZURE + "f1,1,1,1,1,1,1\nf2,3,x,1,1,1,1\n", "line 3: 'x' is not a request count"),
    ("azure-minute", AZURE + "f1,1,1,1,1,1,-4\n", "line 2: a request count is negative"),
    ("azure-minute", AZURE + "f1,1,1,1,1,1,\u00b2\n", "line 2: '\u00b2' is not a request count"),
    ("azure-minute", AZURE + "f1,1,1,1.5,1,1,1\n", "line 2: '1.5' is not a request count"),
    ("requests", "ts,model\n1,a\n", "no timestamp column"),
    ("requests", "timestamp\n1\n", "no model column"),
    ("requests", "timestamp,model\n1.5,a\nyesterday,a\n", "line 3: timestamp 'yesterday' is neither seconds nor"),
    ("requests", "timestamp,model\n1.5,a\nnan,a\n", "line 3: timestamp 'nan' is not a finite time"),
    ("requests", "timestamp,model\n1.5,\n", "line 2: a request needs a model"),
])
def test_a_malformed_trace_is_refused_naming_the_file_and_line(tmp_path: Path, fmt: str, text: str,
                                                               says: str) -> None:
    path = tmp_path / "trace.csv"
    path.write_text(text)
    with pytest.raises(ValueError, match=says) as err:
        if fmt == "requests":
            load_requests_csv(path)
        else:
            load_azure_minutes(path, ["alpha"], random.Random(0))
    assert str(path) in str(err.value)


def test_a_well_formed_trace_reads_as_before(tmp_path: Path) -> None:
    azure = tmp_path / "a.csv"
    azure.write_text(AZURE + "f1,1,0,2,1,1,1\n")
    reqs = load_azure_minutes(azure, ["alpha"], random.Random(0))
    assert len(reqs) == 6 and {r.model for r in reqs} == {"alpha"}
    assert [int(r.t // 60) for r in reqs] == [0, 2, 2, 3, 4, 5]
    per = tmp_path / "r.csv"
    per.write_text("timestamp,model\n2026-12-06T10:00:02+00:00,b\n2026-12-06T10:00:00+00:00,a\n")
    assert load_requests_csv(per) == [Request(0.0, "a"), Request(2.0, "b")]
    # every catalog model --light or --skip: the trace maps onto none (it was "max() arg is an empty sequence")
    assert load_azure_minutes(azure, [], random.Random(0), target_rate=4.0) == []


def test_replay_with_no_such_file_says_so_before_waiting_for_the_web(capsys: pytest.CaptureFixture[str],
                                                                      tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    missing = tmp_path / "nope.csv"
    # a web that would never answer: the refusal comes first, at once
    args = parser.parse_args(["replay", str(missing), "--url", "http://127.0.0.1:9", "--wait-for-web", "600"])
    assert args.func(args) == 2
    assert f"prewarm replay: {missing}: no such file" in capsys.readouterr().err


@pytest.mark.parametrize("limit", ["0", "-3", "x", "1.5"])
def test_events_refuses_a_limit_below_one(capsys: pytest.CaptureFixture[str], limit: str) -> None:
    from prewarm.programs.cli import build_parser

    with pytest.raises(SystemExit) as done:
        build_parser().parse_args(["events", "--limit", limit])
    assert done.value.code == 2
    assert f"argument --limit: {limit!r} is not a whole number of at least 1" in capsys.readouterr().err
    assert build_parser().parse_args(["events", "--limit", "3"]).limit == 3


@pytest.mark.parametrize(("argv", "says"), [
    (["replay", "--speed", "0"], "argument --speed: '0' is not a number above 0"),
    (["replay", "--speed", "nan"], "argument --speed: 'nan' is not a number above 0"),
    (["replay", "--rate", "-1"], "argument --rate: '-1' is not a number of 0 or more"),
    (["replay", "--concurrency", "0"], "argument --concurrency: '0' is not a whole number of at least 1"),
    (["replay", "--models", "0"], "argument --models: '0' is not a whole number of at least 1"),
    (["replay", "--light-interval", "0"], "argument --light-interval: '0' is not a number above 0"),
    (["replay", "--duration", "-5"], "argument --duration: '-5' is not a number above 0"),
    (["replay", "--seed", "-1"], "argument --seed: '-1' is not a whole number of at least 0"),
    (["up", "--port", "70000"], "argument --port: '70000' is not a port"),
    (["up", "--speed", "-60"], "argument --speed: '-60' is not a number above 0"),
    (["preload", "m", "--timeout", "0"], "argument --timeout: '0' is not a number above 0"),
    (["stage", "m", "--value", "inf"], "argument --value: 'inf' is not a finite number"),
    (["drain", "n1", "--timeout", "x"], "argument --timeout: 'x' is not a number above 0"),
])
def test_a_number_no_command_can_use_is_refused_as_the_command_line_is_read(
        capsys: pytest.CaptureFixture[str], argv: list[str], says: str) -> None:
    """Before, `replay --speed 0` waited for the web and then divided by zero."""
    from prewarm.programs.cli import build_parser

    with pytest.raises(SystemExit) as done:
        build_parser().parse_args(argv)
    assert done.value.code == 2
    assert says in capsys.readouterr().err
    good = {"--speed": "30", "--rate": "0", "--concurrency": "4", "--models": "3", "--light-interval": "2.5",
            "--duration": "10", "--seed": "7", "--port": "8080", "--timeout": "12", "--value": "-1.5"}
    fixed = [good.get(argv[i - 1], a) if i and argv[i - 1].startswith("--") else a for i, a in enumerate(argv)]
    args = build_parser().parse_args(fixed)
    option = argv[-2].lstrip("-").replace("-", "_")
    assert getattr(args, option) == type(getattr(args, option))(good[argv[-2]])


def test_a_requests_trace_naming_models_the_catalog_lacks_is_refused(tmp_path: Path) -> None:
    """Every request for such a model would be refused by the hooks: the replay says so before it starts."""
    from prewarm.programs.replay import check_models

    path = tmp_path / "r.csv"
    path.write_text("timestamp,model\n0,a\n1,b\n2,c\n" + "".join(f"{3 + i},x{i}\n" for i in range(6)))
    reqs = load_requests_csv(path)
    with pytest.raises(ValueError, match=r"the catalog has no model b, c, x0, x1, x2 and 3 more: add them"):
        check_models(reqs, ["a", "z"], path)
    check_models(reqs, ["a", "b", "c", *(f"x{i}" for i in range(6)), "z"], path)  # all known: nothing to say
