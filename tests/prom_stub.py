"""A stub Prometheus for the cluster commands' hostile-input tests: a tiny HTTP server on
127.0.0.1 answering ``POST /api/v1/query`` with what a test sets (a body, a status, or a
slow drip). Bounded: a drip stops after ``drip_bytes`` or when the server stops."""

from __future__ import annotations

import json
import threading
import time
import urllib.parse
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def vector(*series: tuple[dict[str, str], str]) -> bytes:
    """An instant-vector answer: ``(labels, value text)`` per series."""
    return json.dumps(
        {
            "status": "success",
            "data": {
                "resultType": "vector",
                "result": [{"metric": m, "value": [1700000000.0, v]} for m, v in series],
            },
        }
    ).encode()


def fleet_answer(node: str = "gn001", cards: str = "1", health: str | None = None):
    """A ``respond`` that answers the fleet's four queries for one node with one card."""
    labels = {"node": node, "instance": f"{node}:9477"}
    card = {**labels, "vendor": "nvidia", "card_type": "H100", "gres": "gpu"}

    def respond(query: str) -> tuple[int, bytes]:
        if query.startswith("up"):
            return 200, vector((labels, "1"))
        if "hetpatrol_card_info" in query:
            return 200, vector((card, cards))
        if "hetpatrol_card_health" in query:
            h = {**labels, "vendor": "nvidia", "card_type": "H100", "hetpatrol_card_health": "ok"}
            return 200, vector((h, health if health is not None else cards))
        return 200, vector()

    return respond


class StubPrometheus:
    """``respond(query) -> (status, body)``, or ``drip`` set: (declared length, bytes
    sent, seconds between bytes); ``declared_length``: the Content-Length sent instead
    of the body's (-1: none)."""

    def __init__(self) -> None:
        self.respond: Callable[[str], tuple[int, bytes]] = lambda q: (200, vector())
        self.drip: tuple[int, int, float] | None = None
        self.declared_length: int | None = None
        self.stop = threading.Event()
        #: set when a drip has sent all its bytes
        self.drip_done = threading.Event()
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # quiet
                pass

            def do_POST(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                form = urllib.parse.parse_qs(self.rfile.read(n).decode())
                query = form.get("query", [""])[0]
                try:
                    if stub.drip is not None:
                        length, count, pause = stub.drip
                        self.send_response(200)
                        self.send_header("Content-Type", "application/json")
                        self.send_header("Content-Length", str(length))
                        self.end_headers()
                        for _ in range(count):
                            if stub.stop.wait(pause):
                                return
                            self.wfile.write(b" ")
                            self.wfile.flush()
                        stub.drip_done.set()
                        return
                    status, body = stub.respond(query)
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    if stub.declared_length != -1:  # -1: no length, the body ends at close
                        self.send_header("Content-Length", str(stub.declared_length or len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except OSError:  # the client gave up: fine
                    return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> StubPrometheus:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)
        time.sleep(0)
