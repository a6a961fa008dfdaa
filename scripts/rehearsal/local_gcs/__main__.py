"""The command line: `python -m scripts.rehearsal.local_gcs [--root DIR] [--bucket NAME ...] [--latency-ms MS]`
serves until Ctrl-C, after printing the environment to export in another shell."""

from __future__ import annotations

import signal
import sys
import tempfile
import threading
from pathlib import Path

from scripts.rehearsal import local_gcs
from scripts.rehearsal.local_gcs.launcher import LocalGCS
from trainer import cli


def main(argv=None) -> int:
    parser = cli.OneLineParser(prog="python -m scripts.rehearsal.local_gcs", description=local_gcs.__doc__.split("\n\n")[0])
    parser.add_argument("--root", help="where the certificates and the server log go (default: a new temp dir)")
    parser.add_argument("--bucket", action="append", default=[], help="a bucket to create (repeatable)")
    parser.add_argument("--port", type=int, default=0, help="the proxy's port (default: a free one)")
    parser.add_argument("--latency-ms", type=float, default=0, help="delay every request by this much")
    args = parser.parse_args(argv)
    scratch = None if args.root else tempfile.TemporaryDirectory(prefix="local-gcs-")
    root = Path(args.root or scratch.name)
    # It listens on loopback only, for this machine's own processes, which reach any host anyway:
    # everything besides Cloud Storage is tunnelled for them (pip in the same shell, say).
    log = lambda line: print(f"local_gcs: {line}", file=sys.stderr, flush=True)  # noqa: E731
    with LocalGCS(root, args.port, allowed_hosts=("*",), log=log) as server:
        server.front.latency_seconds = args.latency_ms / 1000
        for bucket in args.bucket:
            server.create_bucket(bucket)
        print("# local Cloud Storage is up; in another shell, before any trainer command:")
        for key, value in server.environ().items():
            print(f"export {key}={value}")
        print("# objects are kept in memory until Ctrl-C stops the server", flush=True)
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        try:
            stop.wait()
        except KeyboardInterrupt:
            pass
    if scratch:
        scratch.cleanup()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
