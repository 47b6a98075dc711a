"""A bad PREWARM_* variable stops a `prewarm` command with one line naming it, not a traceback."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.procs import REPO


@pytest.mark.parametrize("command", [["models", "list"], ["scheduler"]])
def test_a_bad_variable_is_one_line_naming_it(command: list[str]) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREWARM_")}
    env.update({"PREWARM_TICK_SECONDS": "2x", "PYTHONPATH": str(REPO)})
    p = subprocess.run([sys.executable, "-m", "prewarm.programs.cli", *command], env=env, capture_output=True,
                       text=True, timeout=120, cwd=str(REPO))
    assert p.returncode == 2, p.stdout + p.stderr
    assert p.stderr == ("prewarm: PREWARM_TICK_SECONDS='2x': cannot read '2x' as a duration: "
                        "write e.g. 10s, 15m or 1h\n"), p.stderr


def test_a_bad_sentinel_url_is_one_line_saying_what_to_write_without_its_password() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREWARM_")}
    env.update({"PREWARM_REDIS_URL": "sentinel://:topsecret@h1:26379,h2:26379/", "PYTHONPATH": str(REPO)})
    p = subprocess.run([sys.executable, "-m", "prewarm.programs.cli", "models", "list"], env=env,
                       capture_output=True, text=True, timeout=120, cwd=str(REPO))
    assert p.returncode == 2, p.stdout + p.stderr
    assert p.stderr.count("\n") == 1 and "topsecret" not in p.stderr, p.stderr
    assert p.stderr.startswith("prewarm: PREWARM_REDIS_URL='sentinel://:***@h1:26379,h2:26379/': no master name")
    assert "sentinel://[:PASSWORD@]HOST1:26379,HOST2:26379,HOST3:26379/MASTER_NAME/DB" in p.stderr
