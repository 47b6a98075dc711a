"""A stand-in for a vLLM server's process tree, run under engine_launcher.py in tests (standard library only):

    python engine_standin.py server PORT   # answers GET /health on PORT; starts the "engine core"
    python engine_standin.py core          # renames itself VLLM::EngineCore; starts a "worker"
    python engine_standin.py worker        # renames itself VLLM::Worker

Like vLLM's engine core and workers, the core and the worker rename themselves and do not show the
engine's PREWARM_ENGINE_ID: vLLM's setproctitle overwrites the memory /proc/<pid>/environ reads, here each
is started with an empty environment. They stay in the server's process group and do not die with it.
"""

from __future__ import annotations

import ctypes
import http.server
import subprocess
import sys
import time

PR_SET_NAME = 15
LIFETIME = 600.0  # seconds: a stand-in a test failed to stop goes by itself


def _rename(name: str) -> None:
    ctypes.CDLL(None).prctl(PR_SET_NAME, name.encode()[:15], 0, 0, 0)


def _spawn_hidden(role: str) -> None:
    subprocess.Popen([sys.executable, __file__, role], env={}, stdin=subprocess.DEVNULL)


class _Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - the http.server hook's name
        self.send_response(200 if self.path == "/health" else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *_: object) -> None:
        pass


def main() -> None:
    role = sys.argv[1]
    if role == "server":
        _spawn_hidden("core")
        server = http.server.HTTPServer(("127.0.0.1", int(sys.argv[2])), _Health)
        server.timeout = 1.0
        deadline = time.monotonic() + LIFETIME
        while time.monotonic() < deadline:
            server.handle_request()
        return
    _rename("VLLM::EngineCore" if role == "core" else "VLLM::Worker")
    if role == "core":
        _spawn_hidden("worker")
    time.sleep(LIFETIME)


if __name__ == "__main__":
    main()
