"""The prediction server under load, beside serving.predict's in-process batch rate on the same images.

    python benchmarks/serving_load.py [--architecture resnet50] [--image-size 300] [--concurrency 1,8,32]
                                      [--seconds 20] [--batch-sizes 1,2,4,8,16,32] [--batch-seconds S]
                                      [--soak-seconds 60] [--results-dir DIR]

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
as it would not be on Vertex. So every row also records the CPU seconds per request of the
clients (this process) and of the server (its process tree), the server's cores, the machine's
1-minute load average and the cores other processes used meanwhile (benchmarks/rounds.py's
measures); a row during which, or during the ceilings around which, others used more than
OTHERS_SHARE_LIMIT of the CPUs is flagged and left out of the summary. Before the server starts,
the model alone is timed in-process at each of --batch-sizes (as the server calls it, so the
cost of each batch size it calls can be read off), and a request body's decoding (JSON, base64)
as the server decodes it: together with the CPU columns they account for where the gap between
a concurrency level and the ceiling goes.

The table goes to benchmarks/results/serving_load/KIND.md (benchmarks/machine.py), the raw
measurements report() writes it from to KIND.json beside it.
"""

from __future__ import annotations

import base64
import datetime
import http.client
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
import rounds as rounds_lib  # noqa: E402  (benchmarks/ is on the path)
from machine import RESULTS_ROOT, command_line, cpu_model, write_results  # noqa: E402
from trainer import cli  # noqa: E402
from trainer.process import stopping  # noqa: E402
from trainer.process.ports import free_port  # noqa: E402

# A row (or a ceiling measurement) is flagged when the machine's other processes used more than
# this share of its CPUs meanwhile: clients and server share the cores, so what a neighbour takes
# comes off the server's rate and the ratio compares nothing. The summary leaves flagged rows out.
OTHERS_SHARE_LIMIT = 0.10

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
    """serving.predict's images/s in this process: serving.predict.answer over the images, again and again."""

    def __init__(self, model_dir: str, images: list[bytes]):
        from serving import instances, model as serving_model, predict, predictor as predictor_lib

        self.predict = predict
        self.model = serving_model.load(model_dir)
        self.predictor = predictor_lib.Predictor(self.model, predict.BATCH)
        limits = instances.Limits(len(images), 10 ** 9)
        self.read = [(f"image-{i}.jpg", instances.instance(f"image-{i}.jpg", {"b64": base64.b64encode(image).decode()},
                                                           self.model.inputs, limits)) for i, image in enumerate(images)]
        predict.answer(self.predictor, self.read[:predict.BATCH])  # the first call traces

    def measure(self, seconds: float) -> dict:
        """images/s, CPU seconds per image (this process) and what the rest of the machine did."""
        done, started = 0, time.monotonic()
        timer = rounds_lib.Timer().start()
        while time.monotonic() - started < seconds:
            done += len(self.predict.answer(self.predictor, self.read))
        return measured(timer.sample(done))

    def batch_rate(self, size: int, seconds: float) -> dict:
        """The model alone, called as the server calls it with `size` images at once (the
        signature on a batch of encoded images: decode, resize, ResNet50): images/s and CPU
        seconds per image in this process."""
        import numpy as np

        batch = (self.read * size)[:size]
        columns = {name: np.stack([read[name] for _, read in batch]) for name in self.model.inputs}
        self.model(columns)  # a new batch shape: its first call sets up
        done, started = 0, time.monotonic()
        timer = rounds_lib.Timer().start()
        while time.monotonic() - started < seconds:
            self.model(columns)
            done += size
        return {"batch": size, **measured(timer.sample(done))}


def measured(sample: rounds_lib.Sample) -> dict:
    return {"images_per_s": sample.rate, "cpu_per_image": sample.cpu_per_image, "others": sample.others,
            "load_average": os.getloadavg()[0]}


def request_decoding(bodies: list[bytes], inputs, seconds: float) -> float:
    """CPU seconds one request's body costs the server before the model: serving.instances.parse
    (JSON, base64, the image header checks) for the model's `inputs`, as the server runs it, timed
    in this process."""
    from serving import instances

    limits = instances.Limits(max_instances=64, max_image_pixels=10 ** 9)
    done, started, cpu = 0, time.monotonic(), rounds_lib.own_cpu_seconds()
    while time.monotonic() - started < seconds:
        instances.parse(bodies[done % len(bodies)], inputs, limits)
        done += 1
    return (rounds_lib.own_cpu_seconds() - cpu) / done


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
    soon as the last is answered, for `seconds`. Each run also records the CPU the clients (this
    process) and the server (its process tree) spent, and what the rest of the machine used."""

    def __init__(self, port: int, bodies: list[bytes], instances: int, server_pid: int):
        self.port, self.bodies, self.instances, self.server_pid = port, bodies, instances, server_pid

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
        server_before, clients_before = rounds_lib.tree_cpu_seconds(self.server_pid), rounds_lib.own_cpu_seconds()
        timer = rounds_lib.Timer(lambda: rounds_lib.tree_cpu_seconds(self.server_pid) + rounds_lib.own_cpu_seconds()).start()
        started = time.monotonic()
        for thread in threads:
            thread.start()
        while any(thread.is_alive() for thread in threads):
            if on_second:
                on_second(time.monotonic() - started)
            time.sleep(0.25)
        elapsed = time.monotonic() - started
        sample = timer.sample(len(latencies) * self.instances)
        server_cpu = rounds_lib.tree_cpu_seconds(self.server_pid) - server_before
        clients_cpu = rounds_lib.own_cpu_seconds() - clients_before
        latencies.sort()
        answered = max(len(latencies), 1)
        return {"concurrency": concurrency, "requests": len(latencies), "errors": errors,
                "requests_per_s": len(latencies) / elapsed, "images_per_s": len(latencies) * self.instances / elapsed,
                "p50_ms": 1e3 * percentile(latencies, 50), "p99_ms": 1e3 * percentile(latencies, 99),
                "server_cpu_per_request": server_cpu / answered, "clients_cpu_per_request": clients_cpu / answered,
                "server_cores": server_cpu / elapsed, "others": sample.others, "load_average": os.getloadavg()[0]}


def percentile(sorted_values: list[float], q: float) -> float:
    """The nearest-rank percentile: the smallest value with at least q% of the values at or below it."""
    if not sorted_values:
        return float("nan")
    return sorted_values[max(0, math.ceil(q / 100 * len(sorted_values)) - 1)]


def main(argv=None) -> int:
    parser = cli.OneLineParser(prog="python benchmarks/serving_load.py", description=__doc__.split("\n")[0])
    parser.add_argument("--architecture", default="resnet50", help="cassava.task's --architecture")
    parser.add_argument("--image-size", type=int, default=300, help="cassava.task's --image-size (its default)")
    parser.add_argument("--images", type=int, default=64, help="distinct generated photos the clients cycle through")
    parser.add_argument("--instances", type=int, default=1, help="images per request")
    parser.add_argument("--concurrency", default="1,8,32", help="clients at once, one level after another")
    parser.add_argument("--seconds", type=float, default=20, help="at each level, and for each ceiling measurement")
    parser.add_argument("--batch-sizes", default="1,2,4,8,16,32",
                        help="batch sizes at which the model alone is timed in-process, as the server calls it")
    parser.add_argument("--batch-seconds", type=float, default=None,
                        help="seconds at each of --batch-sizes (default: a quarter of --seconds)")
    parser.add_argument("--soak-seconds", type=float, default=60, help="at the highest concurrency")
    parser.add_argument("--max-batch", type=int, default=32, help="the server's --max-batch")
    parser.add_argument("--rss-growth-mb", type=float, default=64,
                        help="the most the server's memory may grow over the soak, after its first tenth")
    parser.add_argument("--results-dir", default=RESULTS_ROOT, metavar="DIR",
                        help="results root: the table goes to DIR/serving_load/KIND.md ('' for nowhere)")
    args = parser.parse_args(argv)
    try:
        levels = [int(c) for c in args.concurrency.split(",")]
        sizes = [int(b) for b in args.batch_sizes.split(",")]
    except ValueError:
        levels = sizes = []
    if not levels or not sizes or min(levels + sizes) < 1 or min(args.seconds, args.soak_seconds, args.images,
                                                                  args.instances, args.max_batch) <= 0:
        print("serving_load.py: --concurrency and --batch-sizes take positive integers separated by commas; --seconds, "
              "--soak-seconds, --images, --instances and --max-batch must be positive", file=sys.stderr)
        return 2
    print(f"machine: {cpu_model()}", flush=True)
    # A kill ends the run through its cleanup: the server stopped, the scratch directory removed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with tempfile.TemporaryDirectory(prefix="serving-load-") as scratch:
        return measure(args, argv, levels, sizes, scratch)


def measure(args, argv, levels: list[int], sizes: list[int], scratch: str) -> int:
    model_dir = export_model(scratch, args.architecture, args.image_size)
    images = photos(args.images)
    bodies = [json.dumps({"instances": [{"image_bytes": {"b64": base64.b64encode(images[(i + k) % len(images)]).decode()}}
                                        for k in range(args.instances)]}).encode() for i in range(len(images))]
    import tensorflow as tf

    print(f"model: {args.architecture}, {args.image_size} px, TensorFlow {tf.__version__}; requests of {args.instances} "
          f"generated 600x450 JPEG(s), {sum(map(len, images)) / len(images) / 1e3:.0f} KB each", flush=True)
    ceiling = Ceiling(model_dir, images)
    load_before = os.getloadavg()[0]
    batch_seconds = args.batch_seconds or args.seconds / 4
    # Where a request's time goes, before the server runs: the model alone at each batch size the
    # server may call it with, and the body's decoding, both in this process on a machine the
    # server does not yet share.
    batches = [ceiling.batch_rate(size, batch_seconds) for size in sizes]
    for b in batches:
        print(f"model alone, batch {b['batch']}: {b['images_per_s']:.2f} images/s, {1e3 * b['cpu_per_image']:.1f} CPU "
              f"ms/image", flush=True)
    decoding = request_decoding(bodies, ceiling.model.inputs, batch_seconds)
    print(f"request decoding (JSON, base64, header checks): {1e3 * decoding:.2f} CPU ms/request", flush=True)
    port = free_port()
    server = start_server(model_dir, port, os.path.join(scratch, "server.log"), args.max_batch)
    load = Load(port, bodies, args.instances, server.pid)
    try:
        load.run(levels[0], min(args.seconds, 3))  # warm the connections and the server's first calls
        # Each level between two measurements of the ceiling: on a shared machine the load of the
        # moment shifts both alike, and each ratio is taken against the ceiling around it.
        ceilings = [ceiling.measure(args.seconds)]
        print(f"ceiling (serving.predict in-process, batches of 32): {ceilings[-1]['images_per_s']:.2f} images/s", flush=True)
        results = []
        for concurrency in levels:
            results.append(load.run(concurrency, args.seconds))
            ceilings.append(ceiling.measure(args.seconds))
            r = results[-1]
            print(f"concurrency {concurrency}: {r['requests_per_s']:.2f} requests/s, {r['images_per_s']:.2f} images/s, "
                  f"p50 {r['p50_ms']:.0f} ms, p99 {r['p99_ms']:.0f} ms, {len(r['errors'])} errors", flush=True)
            print(f"ceiling (serving.predict in-process, batches of 32): {ceilings[-1]['images_per_s']:.2f} images/s",
                  flush=True)
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
    raw = {"architecture": args.architecture, "image_size": args.image_size, "tensorflow": tf.__version__,
           "instances": args.instances, "seconds": args.seconds, "soak_seconds": args.soak_seconds,
           "max_batch": args.max_batch, "rss_growth_mb": args.rss_growth_mb, "cpus": os.cpu_count(),
           "load_before": load_before, "load_after": os.getloadavg()[0], "ceilings": ceilings, "levels": results,
           "batches": batches, "batch_seconds": batch_seconds, "decoding_cpu_per_request": decoding,
           "soak": {**soak, "errors": soak["errors"][:1], "error_count": len(soak["errors"])},
           "rss": [list(sample) for sample in samples]}
    body = report(raw)
    print(body, flush=True)
    summary = body.splitlines()[-1].strip("`")
    if args.results_dir:
        path = write_results("serving_load", command_line("serving_load.py", argv), datetime.date.today().isoformat(),
                             body, args.results_dir, raw=raw)
        print(f"results: {path}", flush=True)
    print(summary)
    return 0 if soak_passed(raw) and not any(r["errors"] for r in results) else 1


def soak_growth(raw: dict) -> tuple[float, float, float]:
    """(server memory after the soak's first tenth, at its end, growth), MB."""
    samples = raw["rss"]
    settled = [rss for elapsed, rss in samples if elapsed >= raw["soak_seconds"] / 10] or [samples[-1][1]]
    return settled[0] / 2**20, samples[-1][1] / 2**20, (samples[-1][1] - settled[0]) / 2**20


def soak_passed(raw: dict) -> bool:
    return not raw["soak"]["error_count"] and soak_growth(raw)[2] <= raw["rss_growth_mb"]


def flagged(raw: dict) -> list[bool]:
    """Per level: whether others used more than OTHERS_SHARE_LIMIT of the CPUs during it or during
    either ceiling measurement around it (its ratio is over their mean)."""
    limit = OTHERS_SHARE_LIMIT * raw["cpus"]
    ceilings = raw["ceilings"]
    return [max(r["others"], ceilings[i]["others"], ceilings[i + 1]["others"]) > limit
            for i, r in enumerate(raw["levels"])]


def report(raw: dict) -> str:
    """The results file's body, from the run's raw measurements alone (measure's `raw`)."""
    ceilings, levels, cpus = raw["ceilings"], raw["levels"], raw["cpus"]
    flags = flagged(raw)
    around = [(ceilings[i]["images_per_s"] + ceilings[i + 1]["images_per_s"]) / 2 for i in range(len(levels))]
    ceiling_cpu = statistics.median(c["cpu_per_image"] for c in ceilings)
    shared = (f"The machine's 1-minute load average was {raw['load_before']:.1f} before the first measurement and "
              f"{raw['load_after']:.1f} after the last, on {cpus} CPUs.")
    intro = (f"{raw['architecture']} at {raw['image_size']} px (random weights), TensorFlow {raw['tensorflow']}; each "
             f"request {raw['instances']} generated 600x450 JPEG(s); {raw['seconds']:g} s per row, each between two "
             f"{raw['seconds']:g} s measurements of the ceiling (serving.predict in-process, batches of 32, on the same "
             f"images: " + ", ".join(f"{c['images_per_s']:.2f} (others {c['others']:.2f} cores)" for c in ceilings)
             + f" images/s in order, {1e3 * ceiling_cpu:.1f} CPU ms/image). Clients and server share this machine's "
             f"{cpus} CPUs; the server's --max-batch is {raw['max_batch']}. {shared} A row is flagged, and left out of "
             f"the summary, when other processes used more than {OTHERS_SHARE_LIMIT:.0%} of the CPUs "
             f"({OTHERS_SHARE_LIMIT * cpus:.2f} cores) during it or the ceilings around it.")
    table = ["| load | requests/s | images/s | p50 ms | p99 ms | errors | ceiling around it, images/s | over the ceiling "
             "| server CPU ms/request | clients' CPU ms/request | server cores | others' cores | load average | flagged |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r, ceiling, flag in zip(levels, around, flags):
        table.append(f"| server, concurrency {r['concurrency']} | {r['requests_per_s']:.2f} | {r['images_per_s']:.2f} | "
                     f"{r['p50_ms']:.0f} | {r['p99_ms']:.0f} | {len(r['errors'])} | {ceiling:.2f} | "
                     f"x{r['images_per_s'] / ceiling:.2f} | {1e3 * r['server_cpu_per_request']:.1f} | "
                     f"{1e3 * r['clients_cpu_per_request']:.1f} | {r['server_cores']:.2f} | {r['others']:.2f} | "
                     f"{r['load_average']:.1f} | {'yes' if flag else 'no'} |")
    batch_table = ["| model alone, batch | images/s | CPU ms/image |", "|---|---|---|"]
    for b in raw["batches"]:
        batch_table.append(f"| {b['batch']} | {b['images_per_s']:.2f} | {1e3 * b['cpu_per_image']:.1f} |")
    account = (f"Where a request's time goes. The model alone, called in-process as the server calls it (the serving "
               f"signature on a batch of encoded images; the server calls it with the largest power of two, up to its "
               f"--max-batch, that the waiting images fill), {raw['batch_seconds']:g} s at each size, before the server started:\n\n"
               + "\n".join(batch_table)
               + f"\n\nA request's body decoded as the server decodes it (serving.instances.parse: JSON, base64, the "
               f"header checks): {1e3 * raw['decoding_cpu_per_request']:.2f} CPU ms. The server's CPU per request in "
               f"the table holds that, the HTTP handling and the model; the clients' is what this process spent "
               f"sending and reading, taken from the same {cpus} CPUs.")
    soak = raw["soak"]
    first, end, growth = soak_growth(raw)
    soak_line = (f"Soak: {raw['soak_seconds']:.0f} s at concurrency {soak['concurrency']}: {soak['requests']} requests, "
                 f"{soak['error_count']} errors, {soak['images_per_s']:.2f} images/s, p99 {soak['p99_ms']:.0f} ms; "
                 f"server memory {first:.0f} MB after the first tenth, {end:.0f} MB at the end (growth {growth:+.1f} MB, "
                 f"bound {raw['rss_growth_mb']:g} MB): {'ok' if soak_passed(raw) else 'FAILED'}.")
    if soak["errors"]:
        soak_line += f" First error: {soak['errors'][0]}"
    kept = [f"c{r['concurrency']}_over_ceiling={r['images_per_s'] / ceiling:.2f}"
            for r, ceiling, flag in zip(levels, around, flags) if not flag]
    left_out = ",".join(f"c{r['concurrency']}" for r, flag in zip(levels, flags) if flag) or "none"
    summary = ("summary: " + " ".join(kept + [f"left_out={left_out}", f"soak_errors={soak['error_count']}",
                                              f"soak_rss_growth_mb={growth:.1f}"]))
    return intro + "\n\n" + "\n".join(table) + f"\n\n{account}\n\n{soak_line}\n\n`{summary}`"


if __name__ == "__main__":
    sys.exit(main())
