"""A local S3 server for trying dsplatform: ``make s3-local`` runs this.

moto's S3 server (the one the test suite uses) on 127.0.0.1, in this process, with one bucket
made for you; it prints the environment that points ``dsctl`` and ``dsagent`` at it and serves
until Ctrl-C. The data lives in memory and is gone when it stops. moto accepts any key and
secret; the ones printed are only there so that botocore finds credentials.

    python tools/s3local/serve.py [--port 9000] [--bucket datasets]

Needs ``moto[server]`` (in the ``test`` extra; ``make s3-local`` installs it into ``.venv``).
"""

from __future__ import annotations

import argparse
import logging
import signal
import socket
import sys
import threading
import urllib.error
import urllib.request

KEY, SECRET, REGION = "local-key", "local-secret", "us-east-1"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=9000, help="port (default 9000)")
    parser.add_argument("--bucket", default="datasets", help="bucket to create (default datasets)")
    args = parser.parse_args(argv)
    try:
        from moto.server import ThreadedMotoServer
    except ImportError:
        print("s3-local: error: moto's server is not installed (pip install 'moto[server]')", file=sys.stderr)
        return 2
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds: busy means listened on
        try:
            probe.bind((args.host, args.port))
        except OSError as exc:
            print(
                f"s3-local: error: cannot listen on {args.host}:{args.port}: {exc.strerror} (try --port)",
                file=sys.stderr,
            )
            return 2
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # no line per request
    server = ThreadedMotoServer(ip_address=args.host, port=args.port, verbose=False)
    server.start()
    endpoint = f"http://{args.host}:{args.port}"
    # moto's S3 REST API: PUT /<bucket> makes a bucket (no SDK needed here)
    request = urllib.request.Request(f"{endpoint}/{args.bucket}", method="PUT")
    try:
        urllib.request.urlopen(request, timeout=10).close()
    except urllib.error.URLError as exc:
        server.stop()
        print(f"s3-local: error: the server did not answer: {exc}", file=sys.stderr)
        return 1
    print(f"S3 server on {endpoint} (moto, in memory), bucket s3://{args.bucket}; Ctrl-C stops it.")
    print("In the shell that runs dsctl and dsagent:")
    print(
        f"  export AWS_ACCESS_KEY_ID={KEY} AWS_SECRET_ACCESS_KEY={SECRET} "
        f"AWS_DEFAULT_REGION={REGION} AWS_ENDPOINT_URL={endpoint}",
        flush=True,
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        stop.wait()
    except KeyboardInterrupt:
        pass
    server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
