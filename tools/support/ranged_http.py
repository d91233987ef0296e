"""A real HTTP file server on 127.0.0.1 with byte ranges, for tests and benchmarks of
fetches over several links (docs/design.md#links).

It serves a directory's files with a strong ETag (their content's hash), answers ``Range:
bytes=a-b`` with 206 (``ranges=False``: ignores it and sends the whole file, as a server
without ranges does) and ``If-Match`` with 412 when it does not match, and records every
request with the address it came from: loopback addresses 127.0.0.2, 127.0.0.3, ... stand
for a node's NICs. Loopback has no per-NIC bandwidth, so ``rate`` caps each response at
that many bytes per second (a connection as fast as a NIC, or a store's per-connection
limit), and ``cut`` makes the responses to an address stop after that many body bytes (a
link that fails mid-transfer; ``cut_from``: only those of ranges starting there or later).

:class:`RangedServerProcess` is the same server in a process of its own (:func:`main`), for
a test or a benchmark that measures its own process: the server's threads and buffers are
then not counted in the client's memory (``tracemalloc``) or CPU.
"""

from __future__ import annotations

import http.server
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import xxhash

_RANGE = re.compile(r"bytes=(\d+)-(\d*)$")
_PIECE = 64 << 10


@dataclass(frozen=True)
class Request:
    """One request as the server saw it."""

    client: str
    method: str
    path: str
    range: str | None  # the Range header asked
    status: int
    start: int  # the first body byte sent
    sent: int  # body bytes sent


class _Handler(http.server.SimpleHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's name
        pass

    def do_HEAD(self) -> None:
        self._file(body=False)

    def do_GET(self) -> None:
        self._file(body=True)

    def _file(self, *, body: bool) -> None:
        path = Path(self.translate_path(self.path))
        if not path.is_file():
            super().do_GET() if body else super().do_HEAD()
            return
        size, etag = self.server.identify(path)
        asked = self.headers.get("Range")
        wanted = self.headers.get("If-Match")
        if wanted is not None and wanted not in ("*", etag):
            self._answer(412, path, 0, 0, {}, asked, etag, body)
            return
        match = _RANGE.match(asked or "") if self.server.ranges else None
        if match is None:
            self._answer(200, path, 0, size, {}, asked, etag, body)
            return
        start = int(match.group(1))
        end = min(int(match.group(2)) if match.group(2) else size - 1, size - 1)
        if start >= size or end < start:
            self._answer(416, path, 0, 0, {"Content-Range": f"bytes */{size}"}, asked, etag, body)
            return
        headers = {"Content-Range": f"bytes {start}-{end}/{size}"}
        self._answer(206, path, start, end + 1 - start, headers, asked, etag, body)

    def _answer(
        self, status: int, path: Path, start: int, length: int, headers: dict[str, str], asked: str | None,
        etag: str, body: bool,
    ) -> None:  # fmt: skip
        """Answer with ``length`` bytes of ``path`` from ``start``, read a piece at a time
        (the server holds one piece per response, never the file)."""
        client = self.client_address[0]
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(length))
        self.send_header("ETag", etag)
        if self.server.ranges:
            self.send_header("Accept-Ranges", "bytes")
        for key, value in headers.items():
            self.send_header(key, value)
        self.end_headers()
        sent = 0
        cut = self.server.cut.get(client, self.server.cut.get("*")) if body and start >= self.server.cut_from else None
        began = time.monotonic()
        try:
            with open(path, "rb") as file:
                file.seek(start)
                while body and sent < length:
                    if cut is not None and sent >= cut:
                        self.close_connection = True
                        self.connection.shutdown(socket.SHUT_RDWR)
                        break
                    piece = file.read(min(_PIECE, length - sent, (cut - sent) if cut is not None else _PIECE))
                    self.wfile.write(piece)
                    sent += len(piece)
                    if self.server.rate:
                        ahead = sent / self.server.rate - (time.monotonic() - began)
                        if ahead > 0:
                            time.sleep(ahead)
            self.wfile.flush()
        except OSError:
            self.close_connection = True
        finally:
            with self.server.lock:
                self.server.requests.append(Request(client, self.command, self.path, asked, status, start, sent))


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, directory: Path, ranges: bool, rate: int) -> None:
        self.ranges, self.rate = ranges, rate
        self.cut: dict[str, int] = {}
        self.cut_from = 0
        self.requests: list[Request] = []
        self.lock = threading.Lock()
        self._etags: dict[tuple[str, int, int], str] = {}
        super().__init__(("127.0.0.1", 0), lambda *a: _Handler(*a, directory=str(directory)))

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # cut connections

    def identify(self, path: Path) -> tuple[int, str]:
        """``path``'s size and strong ETag (its content's xxh3-128), kept while it is unchanged."""
        stat = path.stat()
        key = (str(path), stat.st_size, stat.st_mtime_ns)
        with self.lock:
            known = self._etags.get(key)
        if known is None:
            digest = xxhash.xxh3_128()
            with open(path, "rb") as file:
                while piece := file.read(_PIECE):
                    digest.update(piece)
            known = f'"{digest.hexdigest()}"'
            with self.lock:
                self._etags[key] = known
        return stat.st_size, known


class RangedServer:
    """Serves ``directory`` on 127.0.0.1 (see the module): ``ranges`` whether ``Range`` is
    answered, ``rate`` bytes/s per response (0: no cap), ``cut`` address (``*``: any) -> body
    bytes after which responses to it stop, for the responses whose first byte is at
    ``cut_from`` or later."""

    def __init__(self, directory: Path, *, ranges: bool = True, rate: int = 0) -> None:
        self._server = _Server(directory, ranges, rate)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    @property
    def cut(self) -> dict[str, int]:
        return self._server.cut

    @property
    def cut_from(self) -> int:
        return self._server.cut_from

    @cut_from.setter
    def cut_from(self, offset: int) -> None:
        self._server.cut_from = offset

    def requests(self, predicate: Callable[[Request], bool] = lambda r: True) -> list[Request]:
        with self._server.lock:
            return [r for r in self._server.requests if predicate(r)]

    def clear(self) -> None:
        with self._server.lock:
            self._server.requests.clear()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class RangedServerProcess:
    """:class:`RangedServer` (``ranges``, ``rate``) in a process of its own, started at once
    and serving until :meth:`close` (or the end of a ``with`` block). Its requests are
    recorded in that process, not here: a test that reads them uses :class:`RangedServer`."""

    def __init__(self, directory: Path, *, ranges: bool = True, rate: int = 0) -> None:
        command = [sys.executable, "-m", "tools.support.ranged_http"]
        command += [str(Path(directory).absolute()), "--rate", str(rate)] + ([] if ranges else ["--no-ranges"])
        root = str(Path(__file__).resolve().parents[2])  # where ``tools`` is importable from
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
        self._process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env)
        assert self._process.stdout is not None
        line = self._process.stdout.readline().strip()  # its URL once it listens; "" if it died
        if not line.startswith("http://"):
            self.close()
            raise RuntimeError(f"the range server did not start (exit status {self._process.returncode})")
        self.url = line

    def close(self) -> None:
        """Stop the server and reap its process."""
        if self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        if self._process.stdout is not None:
            self._process.stdout.close()

    def __enter__(self) -> RangedServerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def main(argv: list[str] | None = None) -> None:
    """``python tools/support/ranged_http.py DIR [--rate BYTES] [--no-ranges]``: serve DIR
    until stopped, after printing its URL (a server in a process of its own:
    :class:`RangedServerProcess`)."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("directory", type=Path)
    parser.add_argument("--rate", type=int, default=0, help="bytes/s per response (0: no cap)")
    parser.add_argument("--no-ranges", action="store_true")
    args = parser.parse_args(argv)
    server = RangedServer(args.directory, ranges=not args.no_ranges, rate=args.rate)
    print(server.url, flush=True)
    threading.Event().wait()


__all__ = ["RangedServer", "RangedServerProcess", "Request", "main"]

if __name__ == "__main__":
    main()
