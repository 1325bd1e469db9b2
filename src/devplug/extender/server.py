"""The extender over HTTP (the standard library's server, one thread per request):
POST /filter, /prioritize and /bind with the scheduler's JSON; GET /healthz (the
server answers) and /readyz (the cache has listed the cluster: the verbs can answer).

A body that is not JSON, or not the verb's shape, gets 400 and one line saying what
was wrong; a failure of the API server gets 503 and one line (filter and prioritize)
or an ExtenderBindingResult with its Error (bind, as the scheduler reads it); never a
traceback. Before the cache has listed the cluster, the verbs answer the same way,
saying so.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from devplug.extender.verbs import BadRequest, Extender, NotReady

log = logging.getLogger("devplug.extender")

MAX_BODY = 64 * 1024 * 1024  # a NodeList of thousands of nodes fits


def api_problem(error: Exception) -> str:
    """The API server's failure in one line (devplug.apiserver.client)."""
    from devplug.apiserver.client import say

    return say(error)


class _Handler(BaseHTTPRequestHandler):
    server: ExtenderServer

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)

    def _send(self, status: int, body: Any) -> None:
        data = (json.dumps(body) if not isinstance(body, str) else body + "\n").encode()
        self.send_response(status)
        kind = "text/plain; charset=utf-8" if isinstance(body, str) else "application/json"
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path == "/healthz":
            self._send(200, "ok")
        elif self.path == "/readyz":
            if self.server.extender.ready:
                self._send(200, "ok")
            else:
                self._send(503, "not ready: the cluster's Nodes and pods are not listed yet")
        else:
            self._send(404, f"no such path {self.path!r}: POST /filter, /prioritize or /bind")

    def do_POST(self) -> None:
        extender = self.server.extender
        verbs: dict[str, Callable[[Any], Any]] = {
            "/filter": extender.filter,
            "/prioritize": extender.prioritize,
            "/bind": extender.bind,
        }
        verb = verbs.get(self.path.rstrip("/"))
        if verb is None:
            self._send(404, f"no such verb {self.path!r}: POST /filter, /prioritize or /bind")
            return
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            self._send(400, "Content-Length: not a number")
            return
        if length > MAX_BODY:
            self._send(413, f"the request has {length} bytes, more than {MAX_BODY}")
            return
        raw = self.rfile.read(length)
        try:
            args = json.loads(raw)
        except ValueError as error:
            self._send(400, f"{self.path}: the body is not JSON: {error}")
            return
        try:
            answer = verb(args)
        except BadRequest as error:
            self._send(400, f"{self.path}: {error}")
            return
        except NotReady as error:
            problem = str(error)
            if self.path.rstrip("/") == "/bind":
                self._send(200, {"Error": problem})
            else:
                self._send(503, f"{self.path}: {problem}")
            return
        except Exception as error:  # the API server's failures, in one line
            problem = api_problem(error)
            log.warning("%s: %s", self.path, problem)
            if self.path.rstrip("/") == "/bind":
                self._send(200, {"Error": problem})
            else:
                self._send(503, f"{self.path}: {problem}")
            return
        self._send(200, answer)


class ExtenderServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], extender: Extender) -> None:
        super().__init__(address, _Handler)
        self.extender = extender

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> threading.Thread:
        """Serve from a thread (tests, embedding); `shutdown()` stops it."""
        thread = threading.Thread(target=self.serve_forever, daemon=True)
        thread.start()
        return thread
