"""A real HTTP server on 127.0.0.1 whose files change between requests, the way a source
rewritten during a copy looks to the agent.

Who uses it: the one-version-per-file tests (``tests/dsagent/cache/test_one_version.py``)
and the per-file fault sweep (``tools/support/faults.py``). It serves an in-memory tree
``{relative path: [version 0, version 1, ...]}`` under ``/data/`` with an HTML index per
directory (what fsspec's HTTP listing reads), HEAD, and single-range GETs answered 206.
Each file moves to its next version after ``flip_after`` GETs of it. ``validators`` picks
what the server says about versions:

- ``"etag"``: an ``ETag`` per version, and ``If-Match`` / ``If-Unmodified-Since`` are
  honoured with 412 (what nginx, S3 and most servers do);
- ``"ignored"``: an ``ETag`` per version, conditions ignored (a server that does not
  implement them);
- ``"none"``: no ``ETag`` and no ``Last-Modified``;
- ``"last-modified"``: only a ``Last-Modified``, one second later for each version, and
  ``If-Unmodified-Since`` honoured.

And validators that stay the same while the bytes change (every version of a file has
one size and is written within one second), conditions honoured as the RFC says:

- ``"same-second"``: only a ``Last-Modified``;
- ``"nginx"``: nginx's ``ETag``, ``"<mtime hex>-<size hex>"``, and its ``Last-Modified``;
- ``"apache"``: Apache's, ``"<inode hex>-<size hex>-<mtime in microseconds, hex>"``;
- ``"weak"``: a weak ``ETag`` (``W/"..."``): ``If-Match`` compares strongly, so a weak ETag
  never matches and every request carrying it is answered 412.
"""

from __future__ import annotations

import hashlib
import http.server
import re
import threading
from collections import Counter
from email.utils import formatdate
from typing import Any


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's name
        pass

    def do_HEAD(self) -> None:
        self._answer(body=False)

    def do_GET(self) -> None:
        self._answer(body=True)

    def _answer(self, *, body: bool) -> None:
        path = self.path.split("?", 1)[0]
        with self.server.lock:
            self.server.requests[(self.command, path)] += 1
        if not path.startswith("/data/"):
            self._send(404, b"")
            return
        relative = path[len("/data/") :]
        if relative == "" or relative.endswith("/"):
            index = self.server.index(relative)
            if index is None:
                self._send(404, b"")
            else:
                self._send(200, index if body else b"", length=len(index), content_type="text/html")
            return
        version, data = self.server.current(relative, count=body)
        if data is None:
            if self.server.index(relative + "/") is not None:  # a directory named without its slash
                self._send(301, b"", headers={"Location": path + "/"})
            else:
                self._send(404, b"")
            return
        headers = _validators(self.server.validators, data, version)
        if self.server.validators not in ("ignored", "none"):
            tag = headers.get("ETag")
            wanted = self.headers.get("If-Match")
            since = self.headers.get("If-Unmodified-Since")
            # If-Match compares strongly: a weak ETag matches nothing
            mismatch = wanted is not None and (tag is None or tag.startswith("W/") or wanted != tag)
            if mismatch or (since is not None and since != headers.get("Last-Modified")):
                with self.server.lock:
                    self.server.refused += 1
                self._send(412, b"", headers=headers)
                return
        match = re.match(r"bytes=(\d+)-(\d*)$", self.headers.get("Range", ""))
        if match is not None and body:
            with self.server.lock:
                self.server.ranged += 1
        if match is None:
            self._send(200, data if body else b"", length=len(data), headers=headers)
            return
        start = int(match.group(1))
        end = min(int(match.group(2)) if match.group(2) else len(data) - 1, len(data) - 1)
        if start >= len(data):
            self._send(416, b"", headers={"Content-Range": f"bytes */{len(data)}"})
            return
        headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
        self._send(206, data[start : end + 1] if body else b"", length=end - start + 1, headers=headers)

    def _send(
        self,
        status: int,
        payload: bytes,
        *,
        length: int | None = None,
        content_type: str = "application/octet-stream",
        headers: dict[str, str] | None = None,
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload) if length is None else length))
        self.send_header("Accept-Ranges", "bytes")
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if payload:
            try:
                self.wfile.write(payload)
            except OSError:
                pass  # the client went away (a killed agent)


#: the second every version of a file is written in, where the validators do not move
_MTIME = 1_700_000_000


def _validators(mode: str, data: bytes, version: int) -> dict[str, str]:
    """The headers a server in ``mode`` names version ``version`` (``data``) of a file with."""
    same_second = formatdate(_MTIME, usegmt=True)
    if mode in ("etag", "ignored"):
        tag = f'"{hashlib.sha1(data).hexdigest()[:16]}-{version}"'
        return {"ETag": tag, "Last-Modified": formatdate(_MTIME + version, usegmt=True)}
    if mode == "same-second":
        return {"Last-Modified": same_second}
    if mode == "last-modified":
        return {"Last-Modified": formatdate(_MTIME + version, usegmt=True)}
    if mode == "nginx":
        return {"ETag": f'"{_MTIME:x}-{len(data):x}"', "Last-Modified": same_second}
    if mode == "apache":
        return {"ETag": f'"{0x2A1B7:x}-{len(data):x}-{_MTIME * 10**6:x}"', "Last-Modified": same_second}
    if mode == "weak":
        return {"ETag": f'W/"{_MTIME:x}-{len(data):x}"', "Last-Modified": same_second}
    return {}


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, files: dict[str, list[bytes]], validators: str, flip_after: int | None) -> None:
        self.files = files
        self.validators = validators
        self.flip_after = flip_after
        self.lock = threading.Lock()
        self.gets: Counter[str] = Counter()
        self.requests: Counter[tuple[str, str]] = Counter()
        self.refused = 0
        self.ranged = 0
        super().__init__(("127.0.0.1", 0), _Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass

    def current(self, relative: str, *, count: bool) -> tuple[int, bytes | None]:
        """The version a request sees now; a GET counts towards the file's next flip."""
        with self.lock:
            versions = self.files.get(relative)
            if versions is None:
                return 0, None
            seen = self.gets[relative]
            index = 0 if not self.flip_after else min(seen // self.flip_after, len(versions) - 1)
            if count:
                self.gets[relative] += 1
            return index, versions[index]

    def index(self, directory: str) -> bytes | None:
        names = set()
        if directory and not any(path.startswith(directory) for path in self.files):
            return None
        for path in self.files:
            if path.startswith(directory):
                rest = path[len(directory) :]
                names.add(rest.split("/", 1)[0] + ("/" if "/" in rest else ""))
        if not names and directory:
            return None
        links = "".join(f'<a href="{name}">{name}</a>\n' for name in sorted(names))
        return f"<html><body>\n{links}</body></html>\n".encode()


class VersionedServer:
    """The server; ``url`` is the dataset's root (``http://127.0.0.1:PORT/data/``)."""

    def __init__(self, files: dict[str, list[bytes]], *, validators: str = "etag", flip_after: int | None = 1) -> None:
        self._server = _Server(files, validators, flip_after)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/data/"

    def settle(self) -> None:
        """Every file stays at its last version from now on (the source is quiet again)."""
        with self._server.lock:
            self._server.files = {path: versions[-1:] for path, versions in self._server.files.items()}
            self._server.gets.clear()

    @property
    def refused(self) -> int:
        """How many requests were answered 412 (a condition on a version that had moved)."""
        return self._server.refused

    @property
    def ranged(self) -> int:
        """How many GETs asked for a range of a file (not the whole of it)."""
        return self._server.ranged

    def requests(self, method: str) -> int:
        with self._server.lock:
            return sum(n for (m, _), n in self._server.requests.items() if m == method)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
