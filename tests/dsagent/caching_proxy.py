"""A small caching HTTP forward proxy on 127.0.0.1, standing in for a P2P engine's proxy.

Dragonfly's dfdaemon (or Kraken's agent) sits on every node as an HTTP proxy: a request for
an object it has seen is answered from the P2P network instead of the origin. This one
keeps whole objects in memory by URL: the first GET of a URL reads it from the origin once
(whole, whatever range was asked), every later GET and HEAD of it is answered from the
cache, byte ranges included. It counts what came from the origin and what it served.
"""

from __future__ import annotations

import http.server
import re
import threading
import urllib.request
from collections import Counter
from typing import Any


class _ProxyHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: CachingProxy

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _object(self) -> bytes | None:
        url = self.path  # absolute-form: a proxy is asked for the whole URL
        with self.server.lock:
            cached = self.server.cache.get(url)
        if cached is not None:
            return cached
        try:
            with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(url, timeout=30) as response:
                data: bytes = response.read()
        except Exception:  # noqa: BLE001 - an origin that fails is a 404 here
            return None
        with self.server.lock:
            self.server.origin_gets[url] += 1
            self.server.cache[url] = data
        return data

    def do_HEAD(self) -> None:
        self._answer(head=True)

    def do_GET(self) -> None:
        self._answer(head=False)

    def _answer(self, *, head: bool) -> None:
        if not self.path.startswith("http://"):
            self.send_error(400, "a proxy request needs an absolute URL")
            return
        data = self._object()
        if data is None:
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        with self.server.lock:
            self.server.served[self.path] += 0 if head else 1
        match = re.match(r"bytes=(\d+)-(\d*)$", self.headers.get("Range", ""))
        start, end = 0, len(data) - 1
        if match is not None:
            start = int(match.group(1))
            end = min(int(match.group(2)) if match.group(2) else len(data) - 1, len(data) - 1)
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
        else:
            self.send_response(200)
        self.send_header("Content-Length", str(max(0, end - start + 1)))
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()
        if not head:
            self.wfile.write(data[start : end + 1])


class CachingProxy(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _ProxyHandler)
        self.lock = threading.Lock()
        self.cache: dict[str, bytes] = {}
        self.origin_gets: Counter[str] = Counter()
        self.served: Counter[str] = Counter()
        self._thread = threading.Thread(target=self.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def close(self) -> None:
        self.shutdown()
        self.server_close()
