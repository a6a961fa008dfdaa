"""What the engine's API service spends while a client waits for a container, the Docker API's way
(`POST /containers/ID/wait`, as container-structure-test waits on each command test's container):
podman's own answer (the baseline, "podman wait") against the rehearsal's front
(scripts/rehearsal/engine_front.py, "as written"), in one run. Needs podman (Docker's daemon has
no such loop to measure).

    python benchmarks/engine_wait.py --image IMAGE [--rounds 5] [--seconds 2] [--results-dir DIR]

One `podman system service` on a socket of the run's, the front in this process before a second
socket. Each round creates a container of IMAGE that sleeps --seconds and exits, starts it, and
waits for it through one socket or the other; the figure is the service's CPU seconds over the
wait alone (its /proc/PID/stat). The two alternate, each round starting with the other one, and
each round records what other processes used meanwhile (benchmarks/rounds.py). The summary gives
each one's median and their ratio; the table goes to benchmarks/results/engine_wait/KIND.md
(benchmarks/machine.py), the raw figures to KIND.json beside it, unless --results-dir ''.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "benchmarks")]

from machine import RESULTS_ROOT  # noqa: E402
from pipeline_startup import OURS, alternate, finish, rounds_report  # noqa: E402
from scripts.rehearsal import engine as engines, engine_front  # noqa: E402
from trainer import cli  # noqa: E402
import rounds  # noqa: E402

BASELINE = "podman wait"
HERTZ = os.sysconf("SC_CLK_TCK")


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float):
        super().__init__("localhost", timeout=timeout)
        self.path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.path)


def api(path: str, method: str, target: str, body: dict | None = None, timeout: float = 120) -> tuple[int, bytes]:
    connection = _UnixConnection(path, timeout)
    try:
        payload = json.dumps(body).encode() if body is not None else None
        connection.request(method, target, body=payload, headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def process_cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / HERTZ


def measure(socket_path: str, engine_socket: str, pid: int, image: str, seconds: float) -> tuple[float, float]:
    """(the service's CPU seconds over one wait through `socket_path`, others' cores meanwhile)."""
    status, body = api(engine_socket, "POST", "/v1.41/containers/create",
                       {"Image": image, "Entrypoint": ["sh", "-c"], "Cmd": [f"sleep {seconds}; exit 3"]})
    if status != 201:
        raise SystemExit(f"engine_wait: the engine could not create a container of {image}: {status} {body[:200]!r}")
    container = json.loads(body)["Id"]
    try:
        api(engine_socket, "POST", f"/v1.41/containers/{container}/start")
        timer = rounds.Timer(cpu=lambda: process_cpu_seconds(pid)).start()
        status, body = api(socket_path, "POST", f"/v1.41/containers/{container}/wait", timeout=seconds + 120)
        sample = timer.sample(1)
        if status != 200 or json.loads(body).get("StatusCode") != 3:
            raise SystemExit(f"engine_wait: the wait answered {status} {body[:200]!r}, not the container's exit 3")
        return sample.cpu, sample.others
    finally:
        api(engine_socket, "DELETE", f"/v1.41/containers/{container}?force=true")


def main(argv=None) -> int:
    parser = cli.OneLineParser(prog="python benchmarks/engine_wait.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--image", required=True, help="a local image with sh and sleep")
    parser.add_argument("--rounds", type=int, default=5, help="rounds, each measuring both (default 5)")
    parser.add_argument("--seconds", type=float, default=2.0, help="how long each container runs (default 2)")
    parser.add_argument("--results-dir", default=RESULTS_ROOT, metavar="DIR",
                        help="where the table goes, in ENGINE_WAIT/KIND.md ('' to only print it)")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.seconds <= 0:
        parser.error("--rounds must be at least 1 and --seconds above 0")
    try:
        settings = engines.settings("podman")
    except engines.EngineError as error:
        parser.error(str(error))
    with tempfile.TemporaryDirectory(prefix="engine-wait-") as work:
        engine_socket, front_socket = os.path.join(work, "podman.sock"), os.path.join(work, "front.sock")
        service = subprocess.Popen(["podman", "system", "service", "--time=0", f"unix://{engine_socket}"],
                                   env={**os.environ, **settings.environ}, cwd="/", stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL)
        front = None
        try:
            for _ in range(150):
                try:
                    if api(engine_socket, "GET", "/_ping", timeout=2)[0] == 200:
                        break
                except OSError:
                    pass
                time.sleep(0.2)
            else:
                raise SystemExit("engine_wait: podman's API service did not start")
            front = engine_front.Front(front_socket, engine_socket)
            threading.Thread(target=front.serve_forever, daemon=True).start()
            sockets = {BASELINE: engine_socket, OURS: front_socket}
            results = alternate(lambda name, index: measure(sockets[name], engine_socket, service.pid, args.image,
                                                            args.seconds), args.rounds, BASELINE)
        finally:
            if front is not None:
                front.close()
            service.terminate()
            service.wait(timeout=30)
    finish("engine_wait", argv, {"seconds": args.seconds, "baseline": BASELINE}, results, report, args.results_dir)
    return 0


def report(raw: dict) -> str:
    """The results file's body, from the run's raw measurements alone."""
    return rounds_report(raw, f"podman's API service's CPU over one Docker API wait for a container that runs "
                              f"{raw['seconds']:g} s", "wait")


if __name__ == "__main__":
    sys.exit(main())
