"""An OpenAI-compatible server standing in for an engine replica's endpoint (standard library only), so a
router's logic is tested without a vLLM engine start (tests/engine_standin.py only answers /health).

    s = OpenAIStandin("replica-a").start()   # a real HTTP server on a free loopback port, in a thread
    s.endpoint                               # http://127.0.0.1:<port>/v1, what prewarm's route answer gives
    s.seen                                   # the model ids it was asked for, one per request
    s.stop()

`POST /v1/chat/completions` and `/v1/completions` answer with `served by <name>` as the text (streamed as
server-sent events when the body says `"stream": true`); `GET /v1/models` and `/health` answer too.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class OpenAIStandin:
    def __init__(self, name: str) -> None:
        self.name = name
        self.seen: list[str] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name=f"standin-{name}", daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def start(self) -> OpenAIStandin:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def count(self) -> int:
        with self._lock:
            return len(self.seen)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        standin = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                if self.path == "/health":
                    return self._json(200, {})
                if self.path == "/v1/models":
                    return self._json(200, {"object": "list", "data": []})
                self._json(404, {"error": {"message": f"no such path {self.path}"}})

            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                model = str(body.get("model"))
                with standin._lock:
                    standin.seen.append(model)
                text = f"served by {standin.name}"
                chat = self.path == "/v1/chat/completions"
                if not chat and self.path != "/v1/completions":
                    return self._json(404, {"error": {"message": f"no such path {self.path}"}})
                if body.get("stream"):
                    return self._stream(model, text, chat)
                choice: dict[str, Any] = {"index": 0, "finish_reason": "stop"}
                choice.update({"message": {"role": "assistant", "content": text}} if chat else {"text": text})
                self._json(200, {"id": "standin", "object": "chat.completion" if chat else "text_completion",
                                 "created": int(time.time()), "model": model, "choices": [choice],
                                 "usage": {"prompt_tokens": 1, "completion_tokens": 3, "total_tokens": 4}})

            def _stream(self, model: str, text: str, chat: bool) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                words = text.split(" ")
                for i, word in enumerate(words):
                    piece = word if i == 0 else " " + word
                    delta = {"delta": {"content": piece}} if chat else {"text": piece}
                    last = i == len(words) - 1
                    chunk = {"id": "standin", "object": "chat.completion.chunk" if chat else "text_completion",
                             "created": int(time.time()), "model": model,
                             "choices": [{"index": 0, **delta, "finish_reason": "stop" if last else None}]}
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                    self.wfile.flush()
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()
                self.close_connection = True

            def _json(self, status: int, body: dict[str, Any]) -> None:
                raw = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def log_message(self, *_: object) -> None:
                pass

        return Handler
