"""A loopback HTTP server for tests (127.0.0.1 only, nothing else is ever contacted): it records each request and
answers it with ``reply(handler)``, by default an OpenAI-style chat completion whose message is ``content``."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def chat_reply(content: str) -> Callable[[BaseHTTPRequestHandler], None]:
    """A reply writing one chat completion whose assistant message is ``content``."""
    def reply(h: BaseHTTPRequestHandler) -> None:
        msg = {"role": "assistant", "content": content}
        body = json.dumps({"choices": [{"index": 0, "message": msg, "finish_reason": "stop"}]}).encode()
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)
    return reply


class LoopbackServer:
    """``url`` (``http://127.0.0.1:PORT``), ``requests`` (method, path, Authorization of each), ``close()``."""

    def __init__(self, reply: Callable[[BaseHTTPRequestHandler], None] | None = None,
                 content: str = '{"score": 99}') -> None:
        reply = reply or chat_reply(content)
        outer = self
        self.requests: list[dict] = []

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _any(self):
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                outer.requests.append({"method": self.command, "path": self.path,
                                       "auth": self.headers.get("Authorization")})
                reply(self)

            do_POST = do_GET = _any

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def auths(self) -> list[str | None]:
        return [r["auth"] for r in self.requests]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
