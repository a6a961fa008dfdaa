"""`python -m serving.server`, the prediction image's entry point, run as a process on this machine
with Vertex AI's variables, and the model read from gs:// on the local Cloud Storage server.

It must answer as serving.predict does on the same bytes; answer every bad request with one line
and go on serving; stay healthy only once the model is loaded; and hold up against clients that
are slow, idle, or send more than it takes. (tests/container/test_serving_image.py runs the same
server in the prediction image, deployed by the rehearsal.)
"""

from __future__ import annotations

import base64
import dataclasses
import http.client
import json
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from helpers import REPO, clean_env, run_module

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
def export(tmp_path_factory, data_root):
    model_dir = tmp_path_factory.mktemp("prediction-server") / "model"
    result = run_module("cassava.task", "--dataset", "synthetic:32", "--epochs", "1", "--steps-per-epoch", "2",
                        "--image-size", "48", "--architecture", "small", "--weights", "none",
                        "--per-replica-batch-size", "4", "--data-dir", str(data_root), "--model-dir", str(model_dir))
    assert result.returncode == 0, result.stderr[-3000:]
    return model_dir


def upload(gcs_server, local, bucket: str, prefix: str) -> str:
    gcs_server.create_bucket(bucket)
    for path in sorted(p for p in local.rglob("*") if p.is_file()):
        gcs_server.upload(bucket, f"{prefix}/{path.relative_to(local).as_posix()}", path.read_bytes())
    return f"gs://{bucket}/{prefix}"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


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


def start(model_uri: str, gcs_server, *flags: str) -> Server:
    port = free_port()
    # The stderr relay as the image runs it; the proxy, CA and token of the local Cloud Storage.
    env = clean_env(TRAINER_RELAY_STDERR="1", AIP_HTTP_PORT=str(port), AIP_HEALTH_ROUTE=HEALTH,
                    AIP_PREDICT_ROUTE=PREDICT, AIP_STORAGE_URI=model_uri, **gcs_server.environ())
    process = subprocess.Popen([sys.executable, "-m", "serving.server", *flags], cwd=REPO, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
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


@pytest.fixture(scope="module")
def served(export, gcs_server):
    server = start(upload(gcs_server, export, "served-models", "cassava/1"), gcs_server, *LIMITS)
    wait_until(server, 200)
    yield server
    code, out, err = server.stop()
    assert code == 0, err[-3000:]
    # The bad requests were the clients' problem: the server logged none of them as its own. (The
    # image only the decoder refuses makes TensorFlow's C++ decoder say so on stderr; a run of good
    # requests writes nothing there: the SIGTERM test below.)
    assert "Traceback" not in err and not re.search(r"^\d\d:\d\d:\d\d \S+: ", err, re.M), err[-3000:]
    assert "stopped on SIGTERM" in out


def expected_from_the_signature(export, images) -> dict:
    import trainer  # noqa: F401
    import tensorflow as tf

    outputs = tf.saved_model.load(str(export)).signatures["serving_default"](image_bytes=tf.constant(images))
    return {"class_name": [n.decode() for n in outputs["class_name"].numpy()],
            "probabilities": outputs["probabilities"].numpy()}


def test_answers_a_vertex_request_from_trainer_predict_as_trainer_predict_does(served, export, tmp_path):
    images = photos(5)
    paths = []
    for index, image in enumerate(images):
        paths.append(tmp_path / f"leaf-{index}.{'png' if index == 4 else 'jpg'}")
        paths[-1].write_bytes(image)
    made = run_module("serving.predict", str(export), *map(str, paths), "--vertex-request")
    assert made.returncode == 0, made.stderr[-2000:]
    status, answer = served.predict(made.stdout.encode(), {"Content-Type": "application/json"})
    assert status == 200, answer
    predictions = answer["predictions"]
    assert [sorted(p) for p in predictions] == [["class_index", "class_name", "probabilities"]] * 5
    printed = run_module("serving.predict", str(export), *map(str, paths))
    assert printed.returncode == 0, printed.stderr[-2000:]
    rows = [line.split("\t") for line in printed.stdout.splitlines()]
    assert [p["class_name"] for p in predictions] == [row[1] for row in rows]
    assert all(abs(max(p["probabilities"]) - float(row[2])) <= 6e-5 for p, row in zip(predictions, rows))
    expected = expected_from_the_signature(export, images)
    np.testing.assert_allclose([p["probabilities"] for p in predictions], expected["probabilities"], atol=1e-5, rtol=0)
    assert [p["class_index"] for p in predictions] == np.argmax(expected["probabilities"], axis=1).tolist()


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
    ("no instances", b'{"inputs": []}', {}, 400, 'request has no "instances"'),
    ("an empty list", b'{"instances": []}', {}, 400, '"instances" is empty: send at least one image'),
    ("not base64", b'{"instances": [{"image_bytes": {"b64": "%%%"}}]}', {}, 400, "instances[0].image_bytes.b64 is not base64"),
    ("not an image", request_body([b"GIF87 but not a picture"]), {}, 400, "instances[0]: not a whole JPEG, PNG, GIF or BMP image"),
    ("a truncated upload", None, {}, 400, "instances[1]: not a whole JPEG, PNG, GIF or BMP image"),
    ("an image the decoder refuses", None, {}, 400, "instances[2]: not a JPEG, PNG, GIF or BMP image the model can decode"),
    ("a decompression bomb", request_body([png_declaring(30000, 30000)]), {}, 400,
     "instances[0]: its header declares 900,000,000 pixels; this server decodes at most 4,000,000 per image"),
    ("too many instances", None, {}, 400, '"instances" holds 9 images; this server takes at most 8 per request'),
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
    """Whether the server closes the connection (reading until it does, or 30 s)."""
    connection.settimeout(30)
    try:
        while connection.recv(65536):
            pass
        return True
    except (ConnectionResetError, socket.timeout):
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


def test_health_answers_503_until_the_model_is_loaded_and_sigterm_drains_the_request_in_progress(export, gcs):
    """The model's read from the bucket is held until the test has seen the server unready; then a
    request is begun, SIGTERM sent, and the request finished: it is answered, and the server exits 0."""
    uri = upload(gcs, export, "slow-models", "cassava/2")
    release = threading.Event()
    gcs.on_request(lambda method, path: release.wait(120), method="GET", path=r"saved_model\.pb")
    server = start(uri, gcs, *LIMITS)
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
    assert err == ""
    assert "stopped on SIGTERM after 1 prediction requests" in out, out


def test_a_model_uri_without_an_export_ends_the_server_with_one_line(gcs, tmp_path):
    gcs.create_bucket("no-models")
    server = start("gs://no-models/nothing/here", gcs)
    out, err = server.process.communicate(timeout=120)
    assert server.process.returncode == 1, out + err
    assert err.splitlines() == ["python -m serving.server: error: gs://no-models/nothing/here: no saved_model.pb there "
                                "(the --model-dir of a finished training job)"], err


class FakeSignature:
    """A serving_default stand-in that records each call's batch, can hold the first call until
    released, and refuses any batch holding b"bad" as the model's decoder would."""

    def __init__(self, hold_first: bool):
        self.batches: list[list[bytes]] = []
        self.release = threading.Event()
        if not hold_first:
            self.release.set()

    def __call__(self, image_bytes):
        import tensorflow as tf

        images = [bytes(image) for image in image_bytes.numpy()]
        self.batches.append(images)
        if len(self.batches) == 1:
            self.release.wait(60)
        if b"bad" in images:
            raise tf.errors.InvalidArgumentError(None, None, "Invalid JPEG data")
        probabilities = tf.one_hot([len(image) % 5 for image in images], 5)
        return {"probabilities": probabilities, "class_index": tf.argmax(probabilities, axis=-1, output_type=tf.int64),
                "class_name": tf.constant([f"class-{len(image) % 5}" for image in images])}


def test_requests_that_arrive_together_share_one_call_of_the_model_and_a_bad_image_fails_only_its_request():
    from serving import predictor as predictor_lib

    signature = FakeSignature(hold_first=True)
    predictor = predictor_lib.Predictor(signature, max_batch=4)
    try:
        first = predictor.submit([b"a"])
        while not signature.batches:  # the model is busy with the first request
            time.sleep(0.01)
        waiting = [predictor.submit([b"bb"]), predictor.submit([b"ccc", b"bad"]), predictor.submit([b"dddd"]),
                   predictor.submit([b"eeeee", b"ffffff"])]
        signature.release.set()
        assert [p["class_name"] for p in first.result(60)] == ["class-1"]
        assert [p["class_name"] for p in waiting[0].result(60)] == ["class-2"]
        with pytest.raises(predictor_lib.UndecodableImage) as raised:
            waiting[1].result(60)
        assert raised.value.index == 1
        assert [p["class_name"] for p in waiting[2].result(60)] == ["class-4"]
        assert [p["class_index"] for p in waiting[3].result(60)] == [0, 1]
    finally:
        predictor.close()
    # The three requests that waited (four images) went in one call, which the bad image spoiled;
    # it was answered again request by request, then image by image; the last request, which would
    # not fit in that call, had a call of its own.
    assert signature.batches[1] == [b"bb", b"ccc", b"bad", b"dddd"]
    assert [b"eeeee", b"ffffff"] in signature.batches and [b"ccc"] in signature.batches and [b"bad"] in signature.batches
    assert not predictor.alive()


def test_a_batch_reaches_the_model_padded_to_one_of_a_few_shapes_and_answers_only_its_images():
    from serving import predictor as predictor_lib

    signature = FakeSignature(hold_first=False)
    predictor = predictor_lib.Predictor(signature, max_batch=6)
    try:
        answers = [predictor.submit(images).result(60) for images in ([b"a", b"bb", b"ccc"], [b"a"] * 5, [b"a"] * 6)]
    finally:
        predictor.close()
    assert [len(batch) for batch in signature.batches] == [4, 6, 6]  # powers of two, at most max_batch
    assert signature.batches[0] == [b"a", b"bb", b"ccc", b"ccc"]
    assert [len(answer) for answer in answers] == [3, 5, 6]
    assert [p["class_name"] for p in answers[0]] == ["class-1", "class-2", "class-3"]


def test_waiting_images_go_to_the_model_in_the_largest_power_of_two_they_fill_with_no_copies():
    # Seven single-image requests wait while the model is busy: padded to 8 they would cost an
    # eighth more compute; they go as 4, then 2, then 1, each image once.
    from serving import predictor as predictor_lib

    signature = FakeSignature(hold_first=True)
    predictor = predictor_lib.Predictor(signature, max_batch=32)
    try:
        first = predictor.submit([b"a"])
        while not signature.batches:
            time.sleep(0.01)
        waiting = [predictor.submit([b"x" * n]) for n in range(2, 9)]
        signature.release.set()
        answers = [future.result(60) for future in [first, *waiting]]
    finally:
        predictor.close()
    assert [len(batch) for batch in signature.batches] == [1, 4, 2, 1]
    assert sorted(image for batch in signature.batches for image in batch) == sorted([b"a"] + [b"x" * n for n in range(2, 9)])
    assert [p["class_name"] for answer in answers for p in answer] == [f"class-{n % 5}" for n in range(1, 9)]


@pytest.mark.parametrize("waiting, max_batch, expected", [(1, 32, 1), (7, 32, 4), (8, 32, 8), (31, 32, 16), (40, 32, 32),
                                                          (5, 6, 4), (6, 6, 6), (9, 6, 6)])
def test_a_call_takes_max_batch_or_the_largest_power_of_two_the_waiting_images_fill(waiting, max_batch, expected):
    from serving import predictor as predictor_lib

    assert predictor_lib.call_size(waiting, max_batch) == expected
