"""Runs an engine command as its child and takes the engine's whole process group down with the worker.

Started by the worker (runtimes/vllm_engine.py) with the *engine's* Python, as a file (the engine's
environment does not have prewarm installed), so it uses the standard library only:

    python engine_launcher.py WORKER_PID COMMAND...

It leads its own process group (the worker starts it with start_new_session) and asks the kernel for
SIGHUP when the worker thread that started it goes away (prctl PR_SET_PDEATHSIG; the worker starts
engines from one long-lived thread). On that signal, or when the worker is already gone, it SIGKILLs the
whole group: the engine and every process the engine spawned (vLLM's engine core), so a SIGKILLed
worker leaves no orphan. A SIGTERM to the group (the worker's release) reaches the engine directly; the
launcher waits for it and exits with its status.
"""

import ctypes
import os
import signal
import subprocess
import sys

PR_SET_PDEATHSIG = 1


def _kill_group(*_: object) -> None:
    os.killpg(0, signal.SIGKILL)  # this process included


def main() -> int:
    worker = int(sys.argv[1])
    cmd = sys.argv[2:]
    signal.signal(signal.SIGHUP, _kill_group)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the engine gets the group's SIGTERM and shuts down
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGHUP, 0, 0, 0) != 0:
            print(f"engine_launcher: prctl failed (errno {ctypes.get_errno()})", file=sys.stderr, flush=True)
    except OSError as exc:
        print(f"engine_launcher: no prctl ({exc}); relying on the parent check", file=sys.stderr, flush=True)
    if os.getppid() != worker:  # the worker died before the death signal was armed
        _kill_group()
    child = subprocess.Popen(cmd)
    while True:
        try:
            rc = child.wait(timeout=1.0)
            return rc if rc >= 0 else 128 - rc
        except subprocess.TimeoutExpired:
            if os.getppid() != worker:  # belt and braces where prctl is unavailable
                _kill_group()


if __name__ == "__main__":
    sys.exit(main())
