"""The prediction server under load, beside serving.predict's in-process batch rate on the same images.

    python benchmarks/serving_load.py [--architecture resnet50] [--image-size 300] [--concurrency 1,8,32]
                                      [--seconds 20] [--soak-seconds 60] [--results-dir DIR]

One run: a model of the given architecture (random weights: the time per image does not depend on
them) is exported as a training job exports it, and `python -m serving.server` (the prediction
image's entry point, run here as a process) serves it on 127.0.0.1. Clients with one connection
each send Vertex AI requests of one generated 600x450 JPEG (`--instances` per request), back to
back, for `--seconds` at each concurrency; requests/s, images/s and the p50 and p99 latency are
printed for each, and their ratio over the ceiling: `serving.predict`'s rate on the same images,
batches of 32 through the same signature in this process, with no HTTP, no JSON and no base64.
Each level runs between two measurements of the ceiling, and its ratio is over their mean: on a
shared machine, the load of the moment shifts both alike.

Then a soak: `--soak-seconds` at the highest concurrency, sampling the server's resident memory
every second. It passes when no request failed and the memory at its end is no more than
--rss-growth-mb above the memory after its first tenth (the allocators settle first).

Clients and server share this machine's cores: what the clients spend is taken from the server,
as it would not be on Vertex. The table goes to benchmarks/results/serving_load/KIND.md
(benchmarks/machine.py).
"""

from __future__ import annotations

import argparse
import base64
import datetime
import http.client
import json
import math
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
from machine import RESULTS_ROOT, command_line, cpu_model, write_results  # noqa: E402  (benchmarks/ is on the path)

from trainer import stopping  # noqa: E402

PREDICT = "/predict"
HEALTH = "/health"


def export_model(directory: str, architecture: str, image_size: int) -> str:
    """A model built and exported as a training job's export is, with random weights."""
    import trainer  # noqa: F401  (legacy Keras first)
    from cassava import model as model_lib, signature as serving, synthetic
    from trainer import precision

    with precision.float32_policy():
        model = model_lib.build(len(synthetic.CLASS_NAMES), image_size, "none", architecture, 0)
    model.compile(loss=model_lib.LOSS, metrics=model_lib.metrics())
    path = os.path.join(directory, "model")
    serving.save(model, path, synthetic.CLASS_NAMES, image_size)
    return path


def photos(count: int) -> list[bytes]:
    import numpy as np
    import tensorflow as tf

    from cassava import synthetic

    rng = np.random.default_rng(0)
    return [tf.io.encode_jpeg(synthetic.make_image(rng, i % 5, size=(450, 600)), quality=90).numpy() for i in range(count)]


class Ceiling:
    """serving.predict's images/s in this process: classify() over the images, again and again."""

    def __init__(self, model_dir: str, images: list[bytes]):
        from serving import predict

        self.predict, self.images = predict, images
        self.signature = predict.load_signature(model_dir)
        self.paths = [f"image-{i}.jpg" for i in range(len(images))]
        predict.classify(self.signature, self.paths[:predict.BATCH], images[:predict.BATCH])  # the first call traces

    def measure(self, seconds: float) -> float:
        done, started = 0, time.monotonic()
        while time.monotonic() - started < seconds:
            done += len(self.predict.classify(self.signature, self.paths, self.images))
        return done / (time.monotonic() - started)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_server(model_dir: str, port: int, log_path: str, max_batch: int) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIP_")}
    env["PYTHONPATH"] = REPO
    log = open(log_path, "w")
    server = subprocess.Popen([sys.executable, "-m", "serving.server", "--model-dir", model_dir, "--port", str(port),
                               "--health-route", HEALTH, "--predict-route", PREDICT, "--max-connections", "256",
                               "--max-batch", str(max_batch)],
                              cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 600
    while True:
        if server.poll() is not None:
            raise SystemExit(f"serving_load: the server exited with {server.returncode}; see {log_path}")
        try:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            connection.request("GET", HEALTH)
            if connection.getresponse().status == 200:
                connection.close()
                return server
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise SystemExit(f"serving_load: the server was not ready in 600 s; see {log_path}")
        time.sleep(0.5)


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


class Load:
    """`concurrency` clients, each on its own keep-alive connection, each sending the next body as
    soon as the last is answered, for `seconds`."""

    def __init__(self, port: int, bodies: list[bytes], instances: int):
        self.port, self.bodies, self.instances = port, bodies, instances

    def run(self, concurrency: int, seconds: float, on_second=None) -> dict:
        latencies: list[float] = []
        errors: list[str] = []
        lock = threading.Lock()
        stop_at = time.monotonic() + seconds

        def client(number: int):
            connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=300)
            sent = number
            while time.monotonic() < stop_at:
                body = self.bodies[sent % len(self.bodies)]
                sent += concurrency
                began = time.monotonic()
                try:
                    connection.request("POST", PREDICT, body=body, headers={"Content-Type": "application/json"})
                    response = connection.getresponse()
                    answer = response.read()
                    ok = response.status == 200 and len(json.loads(answer)["predictions"]) == self.instances
                    problem = None if ok else f"HTTP {response.status}: {answer[:200]!r}"
                except (OSError, http.client.HTTPException, ValueError, KeyError) as error:
                    problem = f"{type(error).__name__}: {error}"
                    connection.close()
                    connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=300)
                with lock:
                    if problem:
                        errors.append(problem)
                    else:
                        latencies.append(time.monotonic() - began)
            connection.close()

        threads = [threading.Thread(target=client, args=(n,), daemon=True) for n in range(concurrency)]
        started = time.monotonic()
        for thread in threads:
            thread.start()
        while any(thread.is_alive() for thread in threads):
            if on_second:
                on_second(time.monotonic() - started)
            time.sleep(0.25)
        elapsed = time.monotonic() - started
        latencies.sort()
        return {"concurrency": concurrency, "requests": len(latencies), "errors": errors,
                "requests_per_s": len(latencies) / elapsed, "images_per_s": len(latencies) * self.instances / elapsed,
                "p50_ms": 1e3 * percentile(latencies, 50), "p99_ms": 1e3 * percentile(latencies, 99)}


def percentile(sorted_values: list[float], q: float) -> float:
    """The nearest-rank percentile: the smallest value with at least q% of the values at or below it."""
    if not sorted_values:
        return float("nan")
    return sorted_values[max(0, math.ceil(q / 100 * len(sorted_values)) - 1)]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--architecture", default="resnet50", help="cassava.task's --architecture")
    parser.add_argument("--image-size", type=int, default=300, help="cassava.task's --image-size (its default)")
    parser.add_argument("--images", type=int, default=64, help="distinct generated photos the clients cycle through")
    parser.add_argument("--instances", type=int, default=1, help="images per request")
    parser.add_argument("--concurrency", default="1,8,32", help="clients at once, one level after another")
    parser.add_argument("--seconds", type=float, default=20, help="at each level, and for each ceiling measurement")
    parser.add_argument("--soak-seconds", type=float, default=60, help="at the highest concurrency")
    parser.add_argument("--max-batch", type=int, default=32, help="the server's --max-batch")
    parser.add_argument("--rss-growth-mb", type=float, default=64,
                        help="the most the server's memory may grow over the soak, after its first tenth")
    parser.add_argument("--results-dir", default=RESULTS_ROOT, metavar="DIR",
                        help="results root: the table goes to DIR/serving_load/KIND.md ('' for nowhere)")
    args = parser.parse_args(argv)
    levels = [int(c) for c in args.concurrency.split(",")]
    print(f"machine: {cpu_model()}", flush=True)
    # A kill ends the run through its cleanup: the server stopped, the scratch directory removed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with tempfile.TemporaryDirectory(prefix="serving-load-") as scratch:
        return measure(args, argv, levels, scratch)


def measure(args, argv, levels: list[int], scratch: str) -> int:
    model_dir = export_model(scratch, args.architecture, args.image_size)
    images = photos(args.images)
    bodies = [json.dumps({"instances": [{"image_bytes": {"b64": base64.b64encode(images[(i + k) % len(images)]).decode()}}
                                        for k in range(args.instances)]}).encode() for i in range(len(images))]
    import tensorflow as tf

    print(f"model: {args.architecture}, {args.image_size} px, TensorFlow {tf.__version__}; requests of {args.instances} "
          f"generated 600x450 JPEG(s), {sum(map(len, images)) / len(images) / 1e3:.0f} KB each", flush=True)
    ceiling = Ceiling(model_dir, images)
    load_before = os.getloadavg()[0]
    port = free_port()
    server = start_server(model_dir, port, os.path.join(scratch, "server.log"), args.max_batch)
    load = Load(port, bodies, args.instances)
    try:
        load.run(levels[0], min(args.seconds, 3))  # warm the connections and the server's first calls
        # Each level between two measurements of the ceiling: on a shared machine the load of the
        # moment shifts both alike, and each ratio is taken against the ceiling around it.
        ceilings = [ceiling.measure(args.seconds)]
        print(f"ceiling (serving.predict in-process, batches of 32): {ceilings[-1]:.2f} images/s", flush=True)
        results = []
        for concurrency in levels:
            results.append(load.run(concurrency, args.seconds))
            ceilings.append(ceiling.measure(args.seconds))
            r = results[-1]
            r["ceiling"] = (ceilings[-2] + ceilings[-1]) / 2
            print(f"concurrency {concurrency}: {r['requests_per_s']:.2f} requests/s, {r['images_per_s']:.2f} images/s, "
                  f"p50 {r['p50_ms']:.0f} ms, p99 {r['p99_ms']:.0f} ms, {len(r['errors'])} errors", flush=True)
            print(f"ceiling (serving.predict in-process, batches of 32): {ceilings[-1]:.2f} images/s", flush=True)
        samples: list[tuple[float, int]] = []
        last = [-1.0]

        def sample(elapsed: float):
            if elapsed - last[0] >= 1.0:
                last[0] = elapsed
                samples.append((elapsed, rss_bytes(server.pid)))
        soak = load.run(max(levels), args.soak_seconds, on_second=sample)
        samples.append((args.soak_seconds, rss_bytes(server.pid)))
    finally:
        stopping.stop([server], 60)
    settled = [rss for elapsed, rss in samples if elapsed >= args.soak_seconds / 10] or [samples[-1][1]]
    growth_mb = (samples[-1][1] - settled[0]) / 2**20
    soak_ok = not soak["errors"] and growth_mb <= args.rss_growth_mb
    # What else ran here: the 1-minute load average before the first measurement and after the last.
    shared = (f"The machine's 1-minute load average was {load_before:.1f} before the first measurement and "
              f"{os.getloadavg()[0]:.1f} after the last, on {os.cpu_count()} CPUs.")
    print(shared)
    table = ["| load | requests/s | images/s | p50 ms | p99 ms | errors | ceiling around it, images/s | over the ceiling |",
             "|---|---|---|---|---|---|---|---|"]
    for r in results:
        table.append(f"| server, concurrency {r['concurrency']} | {r['requests_per_s']:.2f} | {r['images_per_s']:.2f} | "
                     f"{r['p50_ms']:.0f} | {r['p99_ms']:.0f} | {len(r['errors'])} | {r['ceiling']:.2f} | "
                     f"x{r['images_per_s'] / r['ceiling']:.2f} |")
    for r in results:
        print(f"server at concurrency {r['concurrency']}: x{r['images_per_s'] / r['ceiling']:.2f} the ceiling around it")
    soak_line = (f"Soak: {args.soak_seconds:.0f} s at concurrency {max(levels)}: {soak['requests']} requests, "
                 f"{len(soak['errors'])} errors, {soak['images_per_s']:.2f} images/s, p99 {soak['p99_ms']:.0f} ms; "
                 f"server memory {settled[0] / 2**20:.0f} MB after the first tenth, {samples[-1][1] / 2**20:.0f} MB at "
                 f"the end (growth {growth_mb:+.1f} MB, bound {args.rss_growth_mb:g} MB): {'ok' if soak_ok else 'FAILED'}.")
    if soak["errors"]:
        soak_line += f" First error: {soak['errors'][0]}"
    print(soak_line)
    summary = "summary: " + " ".join(f"c{r['concurrency']}_over_ceiling={r['images_per_s'] / r['ceiling']:.2f}"
                                     for r in results) + \
        f" soak_errors={len(soak['errors'])} soak_rss_growth_mb={growth_mb:.1f}"
    if args.results_dir:
        body = (f"{args.architecture} at {args.image_size} px (random weights), TensorFlow {tf.__version__}; each request "
                f"{args.instances} generated 600x450 JPEG(s); {args.seconds:g} s per row, each between two "
                f"{args.seconds:g} s measurements of the ceiling (serving.predict in-process, batches of 32, on the same "
                f"images: {', '.join(f'{c:.2f}' for c in ceilings)} images/s in order). Clients and server share this "
                f"machine's {os.cpu_count()} CPUs; the server's --max-batch is {args.max_batch}. {shared}\n\n"
                + "\n".join(table) + f"\n\n{soak_line}\n\n`{summary}`")
        path = write_results("serving_load", command_line("serving_load.py", argv), datetime.date.today().isoformat(),
                             body, args.results_dir)
        print(f"results: {path}", flush=True)
    print(summary)
    return 0 if soak_ok and not any(r["errors"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
