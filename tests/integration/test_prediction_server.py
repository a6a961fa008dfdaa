"""`python -m serving.server`, the prediction image's entry point, run as a process on this machine
with Vertex AI's variables, and the model read from gs:// on the local Cloud Storage server.

One server serves any export with a serving signature: cassava's image classifier (encoded images
in, class names out) and fares' regression on a table's columns (one 1-D tensor per column in, a
fare out), each exported by its own training code. It must answer as serving.predict does on the
same instances; answer every bad request with one line and go on serving; stay healthy only once
the model is loaded; and hold up against clients that are slow, idle, or send more than it takes.
It runs from a directory holding serving/ alone, as the prediction image does.
(tests/container/test_serving_image.py runs the same server in the prediction image, deployed by
the rehearsal; tests/unit/test_predictor.py holds the batching.)
"""

from __future__ import annotations

import base64
import csv
import dataclasses
import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from helpers import REPO, clean_env, run_module
from trainer.process.ports import free_port

FARES = REPO / "examples" / "fares"

HEALTH = "/v1/endpoints/1234/deployedModels/5678"  # the routes Vertex AI sets by default
PREDICT = HEALTH + ":predict"
LIMITS = ["--max-request-bytes", "300000", "--max-instances", "8", "--max-image-pixels", "4000000",
          "--client-timeout", "4"]


def photos(count: int, seed: int = 3) -> list[bytes]:
    import trainer  # noqa: F401
    import tensorflow as tf
    from cassava import synthetic

    rng = np.random.default_rng(seed)
    encoded = []
    for index in range(count):
        image = synthetic.make_image(rng, index % 5, size=(int(rng.integers(60, 300)), int(rng.integers(60, 300))))
        encoded.append((tf.io.encode_png if index == count - 1 else tf.io.encode_jpeg)(image).numpy())
    return encoded


def request_body(images) -> bytes:
    return json.dumps({"instances": [{"image_bytes": {"b64": base64.b64encode(i).decode()}} for i in images]}).encode()


@pytest.fixture(scope="module")
def export(small_export):
    """The run's tiny cassava export (tests/conftest.py's small_export, trained once and shared with
    tests/container/test_serving_image.py, which trained the same model on its own before)."""
    return small_export


def upload(gcs_server, local, bucket: str, prefix: str) -> str:
    gcs_server.create_bucket(bucket)
    for path in sorted(p for p in local.rglob("*") if p.is_file()):
        gcs_server.upload(bucket, f"{prefix}/{path.relative_to(local).as_posix()}", path.read_bytes())
    return f"gs://{bucket}/{prefix}"


@pytest.fixture(scope="module")
def fares_export(tmp_path_factory):
    """fares' export, trained one short epoch by its own task on generated trips, and three of
    its evaluation trips as a request carries them."""
    root = tmp_path_factory.mktemp("fares")
    env = clean_env(PYTHONPATH=f"{REPO}{os.pathsep}{FARES}")
    made = subprocess.run([sys.executable, "-m", "fares.generate", "--out", str(root / "data"), "--files", "2", "--rows", "200",
                           "--eval-rows", "20"], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr[-3000:]
    trained = subprocess.run([sys.executable, "-m", "fares.task", "--train-files", str(root / "data" / "train-*.csv"),
                              "--epochs", "1", "--per-replica-batch-size", "16", "--model-dir", str(root / "model")],
                             cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert trained.returncode == 0, trained.stderr[-3000:]
    with open(root / "data" / "eval-00000-of-00001.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))[:3]
    trips = [{"distance_km": float(r["distance_km"]), "passengers": int(r["passengers"]), "hour": int(r["hour"]),
              "payment_type": r["payment_type"], "pickup_zone": r["pickup_zone"]} for r in rows]
    return root / "model", trips


@pytest.fixture(scope="module")
def serving_alone(tmp_path_factory):
    """A directory holding serving/ and nothing else of the project, as the prediction image does."""
    root = tmp_path_factory.mktemp("serving-alone")
    shutil.copytree(REPO / "serving", root / "serving", ignore=shutil.ignore_patterns("__pycache__"))
    return root


@dataclasses.dataclass
class Server:
    process: subprocess.Popen
    port: int

    def request(self, method: str, path: str, body: bytes | None = None, headers=None) -> tuple[int, dict | str]:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        try:
            connection.request(method, path, body=body, headers=headers or {})
            response = connection.getresponse()
            text = response.read().decode()
        finally:
            connection.close()
        try:
            return response.status, json.loads(text)
        except ValueError:
            return response.status, text

    def predict(self, body: bytes, headers=None):
        return self.request("POST", PREDICT, body, headers)

    def stop(self) -> tuple[int, str, str]:
        self.process.send_signal(signal.SIGTERM)
        out, err = self.process.communicate(timeout=60)
        return self.process.returncode, out, err


def start(model_uri: str, gcs_server, *flags: str, root=REPO) -> Server:
    """The server as the image starts it, from `root` (its only path), with Vertex's variables and
    the proxy, CA and token of the local Cloud Storage."""
    port = free_port()
    env = clean_env(PYTHONPATH=str(root), AIP_HTTP_PORT=str(port), AIP_HEALTH_ROUTE=HEALTH,
                    AIP_PREDICT_ROUTE=PREDICT, AIP_STORAGE_URI=model_uri, **gcs_server.environ())
    process = subprocess.Popen([sys.executable, "-m", "serving.server", *flags], cwd=root, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace")
    return Server(process, port)


def wait_until(server: Server, status: int, deadline: float = 120) -> None:
    stop = time.monotonic() + deadline
    while True:
        assert server.process.poll() is None, server.process.communicate()
        try:
            if server.request("GET", HEALTH)[0] == status:
                return
        except OSError:
            pass
        assert time.monotonic() < stop, f"the health route never answered {status}"
        time.sleep(0.2)


def stopped_cleanly(server: Server) -> tuple[str, str]:
    code, out, err = server.stop()
    assert code == 0, err[-3000:]
    # The bad requests were the clients' problem: the server logged none of them as its own. (The
    # image only the decoder refuses makes TensorFlow's C++ decoder say so on stderr; a run of good
    # requests writes nothing there: the SIGTERM test below.)
    assert "Traceback" not in err and not re.search(r"^\d\d:\d\d:\d\d \S+: ", err, re.M), err[-3000:]
    assert "stopped on SIGTERM" in out
    return out, err


@pytest.fixture(scope="module")
def served(export, gcs_server, serving_alone):
    server = start(upload(gcs_server, export, "served-models", "cassava/1"), gcs_server, *LIMITS, root=serving_alone)
    wait_until(server, 200)
    yield server
    out, _ = stopped_cleanly(server)
    assert re.search(r"serving: model loaded from gs://served-models/cassava/1 in \S+: serving_default\(image_bytes "
                     r"string\) -> class_index int64, class_name string, probabilities float32\[5\]; ready on \S+$", out, re.M), out


@pytest.fixture(scope="module")
def served_fares(fares_export, gcs_server, serving_alone):
    model_dir, _ = fares_export
    server = start(upload(gcs_server, model_dir, "served-fares", "fares/1"), gcs_server, *LIMITS, root=serving_alone)
    wait_until(server, 200)
    yield server
    out, _ = stopped_cleanly(server)
    assert re.search(r"serving: model loaded from gs://served-fares/fares/1 in \S+: serving_default\(distance_km "
                     r"float32, hour int64, passengers int64, payment_type string, pickup_zone string\) -> fare float32; "
                     r"ready on \S+ \(not warmed up: the first request makes the model's first call\)$", out, re.M), out


_SIGNATURE_SCRIPT = """
import json, sys
import tensorflow as tf
signature = tf.saved_model.load(sys.argv[1]).signatures["serving_default"]
columns = json.load(sys.stdin)
dtypes = {name: spec.dtype for name, spec in signature.structured_input_signature[1].items()}
outputs = signature(**{name: tf.constant([bytes.fromhex(v) if dtypes[name] == tf.string and name.endswith("_bytes") else v
                                          for v in values], dtypes[name]) for name, values in columns.items()})
print(json.dumps({name: [v.decode() if isinstance(v, bytes) else v for v in tensor.numpy().tolist()]
                  for name, tensor in outputs.items()}))
"""


def expected_from_the_signature(model_dir, columns: dict) -> dict:
    """What the export's serving_default answers for `columns` (one list per input; `_bytes`
    inputs as hex), called with TensorFlow directly in a fresh process."""
    result = subprocess.run([sys.executable, "-c", _SIGNATURE_SCRIPT, str(model_dir)], input=json.dumps(columns), cwd=REPO,
                            env=clean_env(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def printed_predictions(result: subprocess.CompletedProcess) -> list[tuple[str, object]]:
    assert result.returncode == 0, result.stderr[-2000:]
    rows = [line.split("\t") for line in result.stdout.splitlines()]
    assert all(len(row) == 2 for row in rows), result.stdout
    return [(source, json.loads(prediction)) for source, prediction in rows]


def test_answers_a_vertex_request_from_serving_predict_as_serving_predict_does(served, export, tmp_path):
    images = photos(5)
    paths = []
    for index, image in enumerate(images):
        paths.append(tmp_path / f"leaf-{index}.{'png' if index == 4 else 'jpg'}")
        paths[-1].write_bytes(image)
    made = run_module("serving.predict", str(export), *map(str, paths), "--vertex-request")
    assert made.returncode == 0, made.stderr[-2000:]
    assert [base64.b64decode(i["image_bytes"]["b64"]) for i in json.loads(made.stdout)["instances"]] == images
    status, answer = served.predict(made.stdout.encode(), {"Content-Type": "application/json"})
    assert status == 200, answer
    predictions = answer["predictions"]
    assert [sorted(p) for p in predictions] == [["class_index", "class_name", "probabilities"]] * 5
    printed = printed_predictions(run_module("serving.predict", str(export), *map(str, paths)))
    assert [source for source, _ in printed] == list(map(str, paths))
    assert [p["class_name"] for p in predictions] == [p["class_name"] for _, p in printed]
    np.testing.assert_allclose([p["probabilities"] for p in predictions], [p["probabilities"] for _, p in printed],
                               atol=6e-5, rtol=0)
    expected = expected_from_the_signature(export, {"image_bytes": [image.hex() for image in images]})
    np.testing.assert_allclose([p["probabilities"] for p in predictions], expected["probabilities"], atol=1e-5, rtol=0)
    assert [p["class_index"] for p in predictions] == expected["class_index"]
    assert [p["class_name"] for p in predictions] == expected["class_name"]


def test_the_same_server_answers_a_table_model_by_its_columns_as_serving_predict_does(served_fares, fares_export, tmp_path):
    model_dir, trips = fares_export
    status, answer = served_fares.predict(json.dumps({"instances": trips}).encode())
    assert status == 200, answer
    fares = answer["predictions"]  # one output: each prediction is the fare alone
    assert len(fares) == 3 and all(isinstance(fare, float) for fare in fares), answer
    expected = expected_from_the_signature(model_dir, {name: [trip[name] for trip in trips] for name in trips[0]})
    np.testing.assert_allclose(fares, expected["fare"], rtol=1e-6)
    lines = tmp_path / "trips.jsonl"
    lines.write_text("".join(json.dumps(trip) + "\n" for trip in trips))
    printed = printed_predictions(run_module("serving.predict", str(model_dir), "--instances", str(lines)))
    assert printed == [(f"{lines}:{n}", fare) for n, fare in enumerate(fares, start=1)]
    made = run_module("serving.predict", str(model_dir), "--instances", str(lines), "--vertex-request")
    assert made.returncode == 0 and json.loads(made.stdout) == {"instances": trips}, made.stderr[-2000:]


FARE_REQUESTS = [
    ("a category its lookup does not know", {"payment_type": "bitcoin"}, "instances[1]: the model refused it: assertion failed: "),
    ("a number as text", {"distance_km": "far"}, "instances[1].distance_km is not float32 (got text)"),
    ("a fraction of a passenger", {"passengers": 1.5}, "instances[1].passengers is not int64 (got a fraction)"),
    ("a missing column", {"hour": None}, 'instances[1] has no "hour"; the model\'s inputs: distance_km, hour, passengers, '),
    ("a column it does not take", {"tip": 2.0}, "instances[1].tip is no input of the model; its inputs: "),
]


@pytest.mark.parametrize("name, change, message", FARE_REQUESTS, ids=[r[0] for r in FARE_REQUESTS])
def test_a_bad_table_row_is_one_line_and_the_next_good_request_is_answered(served_fares, fares_export, name, change, message):
    _, trips = fares_export
    bad = {key: value for key, value in {**trips[1], **change}.items() if value is not None}
    status, answer = served_fares.predict(json.dumps({"instances": [trips[0], bad]}).encode())
    assert status == 400 and list(answer) == ["error"] and answer["error"].startswith(message), answer
    assert "\n" not in answer["error"] and "Traceback" not in answer["error"]
    after, predictions = served_fares.predict(json.dumps({"instances": trips}).encode())
    assert after == 200 and len(predictions["predictions"]) == 3, predictions


def corrupt_jpeg() -> bytes:
    """A whole JPEG, header and end marker included, whose frame header declares 12-bit samples:
    every check of its bytes passes, and only the model's decoder (8-bit libjpeg) refuses it."""
    image = bytearray(photos(2, seed=9)[0])  # the last of photos() is a PNG
    frame = image.index(b"\xff\xc0")
    image[frame + 4] = 12  # sample precision
    return bytes(image)


def png_declaring(width: int, height: int) -> bytes:
    import struct
    import zlib

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(b"\x00" * 64)) + chunk(b"IEND", b""))


def chunked(*parts: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in parts) + b"0\r\n\r\n"


BAD_REQUESTS = [
    ("not JSON", b"image=leaf.jpg", {}, 400, "request body is not JSON: Expecting value"),
    ("no instances", b'{"inputs": []}', {}, 400, 'request has no "instances"; expected {"instances": [{"image_bytes": {"b64": "..."}}]}'),
    ("an empty list", b'{"instances": []}', {}, 400, '"instances" is empty: send at least one instance'),
    ("not base64", b'{"instances": [{"image_bytes": {"b64": "%%%"}}]}', {}, 400, "instances[0].image_bytes.b64 is not base64"),
    ("not an image", request_body([b"GIF87 but not a picture"]), {}, 400,
     "instances[0]: the model refused it: Invalid GIF data"),
    ("a truncated upload", None, {}, 400, "instances[1].image_bytes: not a whole JPEG image"),
    ("an image the decoder refuses", None, {}, 400, "instances[2]: the model refused it: "),
    ("a decompression bomb", request_body([png_declaring(30000, 30000)]), {}, 400,
     "instances[0].image_bytes: its header declares 900,000,000 pixels; this server decodes at most 4,000,000 per image"),
    ("too many instances", None, {}, 400, '"instances" holds 9 instances; this server takes at most 8 per request'),
    ("a body over the limit", b"{" + b" " * 400000 + b"}", {}, 413, "request body is 400,002 bytes; this server reads at most 300,000"),
    ("a chunked body over the limit", chunked(*[b" " * 100000] * 4), {"Transfer-Encoding": "chunked"}, 413,
     "request body is over 300,000 bytes"),
]


def bad_body(name: str, body: bytes | None, good: list[bytes]) -> bytes:
    """The body of one of BAD_REQUESTS, made of good photos where it needs them."""
    if body is not None:
        return body
    return {"a truncated upload": lambda: request_body([good[0], good[1][:-300]]),
            "an image the decoder refuses": lambda: request_body([good[0], good[1], corrupt_jpeg()]),
            "too many instances": lambda: request_body([good[0]] * 9)}[name]()


@pytest.mark.parametrize("name, body, headers, status, message", BAD_REQUESTS, ids=[b[0] for b in BAD_REQUESTS])
def test_a_bad_request_is_one_line_and_the_next_good_request_is_answered(served, name, body, headers, status, message):
    good = photos(3, seed=11)
    answered, answer = served.predict(bad_body(name, body, good), headers)
    assert answered == status, answer
    assert list(answer) == ["error"] and answer["error"].startswith(message), answer
    assert "\n" not in answer["error"] and "Traceback" not in answer["error"]
    after, predictions = served.predict(request_body(good))
    assert after == 200 and len(predictions["predictions"]) == 3, predictions


def test_other_methods_and_paths_get_their_status_and_no_trace(served):
    for method, path, status in (("GET", PREDICT, 405), ("POST", HEALTH, 405), ("GET", "/predict", 404),
                                 ("DELETE", PREDICT, 405)):
        answered, text = served.request(method, path)
        assert answered == status and "Traceback" not in str(text), (method, path, text)


def raw_connection(server: Server) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=60)


def closed_by_server(connection: socket.socket) -> bool:
    """Whether the server closes the connection (reading until it does, or 30 s). A reset is a
    close too: a server that closes a connection with bytes of it still unread (a client that
    trickles) makes the kernel answer with RST instead of FIN, whichever comes first being a
    matter of timing."""
    connection.settimeout(30)
    try:
        while connection.recv(65536):
            pass
        return True
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False


def test_idle_and_slow_clients_hold_up_no_one_and_are_closed_after_the_client_timeout(served):
    good = request_body(photos(1))  # made first: the three below must still be within their timeout
    idle = raw_connection(served)  # connects, sends nothing
    trickling = raw_connection(served)  # a request head a few bytes at a time, never finished
    trickling.sendall(b"POST " + PREDICT.encode() + b" HTTP/1.1\r\nHost: x\r\n")
    slow_body = raw_connection(served)  # a whole head, and a body that never comes
    slow_body.sendall(b"POST " + PREDICT.encode() + b" HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n\r\n{\"inst")
    stop_trickling = threading.Event()

    def trickle():
        while not stop_trickling.wait(0.5):
            try:
                trickling.sendall(b"X")
            except OSError:
                return
    threading.Thread(target=trickle, daemon=True).start()
    try:
        status, answer = served.predict(good)
        assert status == 200, answer  # answered while the three are still there
        for connection in (idle, trickling, slow_body):
            connection.setblocking(False)
            with pytest.raises(BlockingIOError):
                connection.recv(1)  # still open, nothing said to them yet
            connection.setblocking(True)
        assert closed_by_server(idle) and closed_by_server(trickling)
        slow_body.settimeout(30)
        assert slow_body.recv(65536).startswith(b"HTTP/1.1 408 ")
    finally:
        stop_trickling.set()
        for connection in (idle, trickling, slow_body):
            connection.close()


def test_a_body_over_the_limit_is_refused_before_it_is_sent(served):
    """Its Content-Length alone is enough: the answer comes though the body never does."""
    connection = raw_connection(served)
    try:
        connection.sendall(b"POST " + PREDICT.encode() + b" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                           b"Content-Length: 50000000\r\n\r\n{\"instances\": [")
        answer = connection.recv(65536)
        assert answer.startswith(b"HTTP/1.1 413 ") and b"connection: close" in answer.lower(), answer
        assert closed_by_server(connection)
    finally:
        connection.close()
    assert served.predict(request_body(photos(1)))[0] == 200


def test_health_answers_503_until_the_model_is_loaded_and_sigterm_drains_the_request_in_progress(export, gcs, serving_alone):
    """The model's read from the bucket is held until the test has seen the server unready; then a
    request is begun, SIGTERM sent, and the request finished: it is answered, and the server exits 0."""
    uri = upload(gcs, export, "slow-models", "cassava/2")
    release = threading.Event()
    gcs.on_request(lambda method, path: release.wait(120), method="GET", path=r"saved_model\.pb")
    server = start(uri, gcs, *LIMITS, root=serving_alone)
    try:
        wait_until(server, 503)
        status, answer = server.predict(request_body(photos(1)))
        assert status == 503 and answer == {"error": f"the model is loading; {HEALTH} answers 200 once it is ready"}
        release.set()
        wait_until(server, 200)
        body = request_body(photos(2))
        connection = raw_connection(server)
        connection.sendall(b"POST " + PREDICT.encode() + b" HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body)
                           + body[:100])
        # Nothing outside the server shows the moment it has read a request head (it answers
        # only once the body is in); a second is far more than the event loop takes.
        time.sleep(1)
        server.process.send_signal(signal.SIGTERM)
        time.sleep(1)  # the server is shutting down while the body is still coming
        connection.sendall(body[100:])
        connection.settimeout(60)
        answer = connection.recv(65536)
        assert answer.startswith(b"HTTP/1.1 200 "), answer
        out, err = server.process.communicate(timeout=60)
    finally:
        release.set()
        server.process.kill()
    assert server.process.returncode == 0, err[-3000:]
    assert err == ""  # TensorFlow's load-time lines too are left out (serving/quiet_tensorflow.py)
    assert "stopped on SIGTERM after 1 prediction requests" in out, out


def test_a_model_uri_without_an_export_ends_the_server_with_one_line(gcs, serving_alone):
    gcs.create_bucket("no-models")
    server = start("gs://no-models/nothing/here", gcs, root=serving_alone)
    out, err = server.process.communicate(timeout=120)
    assert server.process.returncode == 1, out + err
    assert err.splitlines() == ["python -m serving.server: error: gs://no-models/nothing/here: no saved_model.pb there "
                                "(the --model-dir of a finished training job)"], err


def test_a_signature_the_export_does_not_have_ends_the_server_with_one_line(export, gcs, serving_alone):
    server = start(upload(gcs, export, "other-signatures", "cassava/3"), gcs, "--signature", "serving_pixel", root=serving_alone)
    out, err = server.process.communicate(timeout=120)
    assert server.process.returncode == 1, out + err
    assert err.splitlines() == ["python -m serving.server: error: gs://other-signatures/cassava/3: no signature "
                                "'serving_pixel' (it has: serving_default, serving_pixels); --signature chooses one"], err
