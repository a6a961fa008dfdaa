"""The prediction image, built, linted, structure-tested and deployed by the rehearsal
(`scripts/deploy_model.py local`): the model exported here, read by the image from the local Cloud
Storage at its gs:// URI, answering as serving.predict does on the same bytes, refusing every bad
request in one line and answering the next good one, starting with nothing on stderr, and leaving
nothing behind. (tests/integration/test_prediction_server.py covers the server process in depth.)
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading

import pytest

from containers import leftovers, run_as_written, sh, user_env
from test_vertex_rehearsal import lines
from helpers import BUDGETS, REPO, clean_env, run_module
from integration.test_prediction_server import (BAD_REQUESTS, HEALTH, PREDICT, Server, bad_body, photos, raw_connection,
                                                request_body)

PYTHON = str(REPO / ".venv" / "bin" / "python")
ARTIFACTS = "gs://serving-models/runs/1/model"
LIMITS = ["--max-request-bytes", "300000", "--max-instances", "8", "--max-image-pixels", "4000000", "--client-timeout", "4"]


def test_the_prediction_dockerfile_passes_hadolint():
    result = sh("hadolint", "--config", ".hadolint.yaml", "images/serving/Dockerfile", check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_prediction_image_passes_its_structure_tests(engine, serving_image):
    _, env = engine
    sh("scripts/supply_chain/images.sh", "test", "tf-predictor-cpu", env={**env, "TAG": "test"})
    with open(os.path.join(env["IMAGES_WORK"], "structure-tf-predictor-cpu.json")) as report_file:
        report = json.load(report_file)
    assert report["Fail"] == 0 and report["Pass"] >= 10, report
    assert any(r["Name"].startswith("Command Test") for r in report["Results"])


def test_the_prediction_image_carries_the_server_alone_and_owns_none_of_its_packages(engine, serving_image):
    tool, env = engine
    listed = sh(tool, "run", "--rm", "--entrypoint", "ls", serving_image, "/opt/app", env=env).stdout.split()
    assert listed == ["serving"]
    size = int(sh(tool, "image", "inspect", "--format", "{{.Size}}", serving_image, env=env).stdout)
    BUDGETS.append(f"prediction image: {size / 1e9:.2f} GB uncompressed")
    result = sh(tool, "run", "--rm", "--entrypoint", "bash", serving_image, "-c",
                "touch /opt/venv/lib/python3.*/site-packages/x 2>&1 || echo refused", env=env)
    assert result.stdout.strip().endswith("refused")


@pytest.fixture(scope="module")
def export(small_export):
    """A tiny model (the small architecture, 48 px), trained and exported once on this machine: the
    run's small_export (tests/conftest.py), shared with tests/integration/test_prediction_server.py,
    which trained the same model on its own before."""
    return small_export


def rehearsal(engine, image: str, export, *options: str) -> list[str]:
    tool, _ = engine
    return [PYTHON, "scripts/deploy_model.py", "local", "--engine", tool, "--image-uri", image,
            "--artifact-uri", ARTIFACTS, "--stage", f"{export}={ARTIFACTS}", "--predict-route", PREDICT,
            "--health-route", HEALTH, *options]


MARKER = "<!-- tested as written: tests/container/test_serving_image.py -->"


def serving_md_block() -> str:
    """docs/serving.md's rehearsal: a request made by serving.predict, answered by the deployed image."""
    text = (REPO / "docs" / "serving.md").read_text()
    assert MARKER in text, "docs/serving.md no longer marks its rehearsal"
    block = re.match(r"\s*```[a-z]*\n(.*?)```", text.split(MARKER, 1)[1], re.S)
    assert block, "the marker must come right before a fenced block"
    return block.group(1)


def test_the_docs_rehearsal_answers_serving_predicts_request_as_serving_predict_does(engine, serving_image, export,
                                                                                      tmp_path):
    """Run as written in a user's shell, in a copy of the project's layout with the model where
    run_local.sh puts it, the images the command names beside it, and the tests' prediction image
    under the tag the command names (whatever held that tag gets it back)."""
    command = serving_md_block()
    image = re.search(r"--image-uri (localhost/\S+)", command).group(1)
    for name in ("scripts", "trainer", ".venv"):
        (tmp_path / name).symlink_to(REPO / name)
    (tmp_path / "output").mkdir()
    (tmp_path / "output" / "model").symlink_to(export)
    files = re.findall(r"\b(\S+\.(?:jpg|png))\b", command.split("\n")[0])
    for name, content in zip(files, photos(len(files), seed=21)):
        (tmp_path / name).write_bytes(content)
    result = run_as_written(engine, serving_image, image, command, tmp_path)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    answer = json.loads(lines(result.stdout, "response", "200")[0])["predictions"]
    paths = [str(tmp_path / name) for name in files]
    local = predicted_here(export, *paths)
    assert [source for source, _ in local] == paths
    assert len(answer) == len(local) == len(files)
    # The Keras 3 export takes bytes and answers class names, in the image as serving.predict here.
    assert [p["class_name"] for p in answer] == [q["class_name"] for _, q in local]
    assert all(abs(a - b) <= 1e-5 for p, (_, q) in zip(answer, local) for a, b in zip(p["probabilities"], q["probabilities"]))
    expected = served_here(export, paths)
    assert all(abs(a - b) <= 1e-5 for p, e in zip(answer, expected) for a, b in zip(p["probabilities"], e)), (answer, expected)
    # The model was read from Vertex's copy of the artifacts at its gs:// URI; a healthy start
    # wrote nothing to stderr (Cloud Logging's ERROR); the container stopped cleanly on SIGTERM.
    model = lines(result.stdout, "model")
    assert any(re.search(r"serving: model loaded from gs://caip-tenant-local-artifacts/\S+ in ", line) for line in model), model
    assert lines(result.stdout, "model", "ERROR") == [], result.stdout[-3000:]
    assert lines(result.stdout, "local-run")[-1].endswith("with exit code 0"), result.stdout[-2000:]
    assert not [line for line in result.stderr.splitlines() if "deploy_model" in line or "Traceback" in line], result.stderr
    assert leftovers(engine) == []


def predicted_here(export, *args: str) -> list[tuple[str, object]]:
    """What `python -m serving.predict EXPORT ARGS` prints on this machine: (source, prediction) a line."""
    printed = run_module("serving.predict", str(export), *args)
    assert printed.returncode == 0, printed.stderr[-2000:]
    return [(source, json.loads(prediction)) for source, prediction in
            (line.split("\t", 1) for line in printed.stdout.splitlines())]


def served_here(export, paths) -> list[list[float]]:
    """The export's serving_default on the same files, in this machine's TensorFlow."""
    script = ("import json, sys, trainer, tensorflow as tf\n"
              "signature = tf.saved_model.load(sys.argv[1]).signatures['serving_default']\n"
              "images = [open(p, 'rb').read() for p in sys.argv[2:]]\n"
              "print(json.dumps(signature(image_bytes=tf.constant(images))['probabilities'].numpy().tolist()))\n")
    result = subprocess.run([PYTHON, "-c", script, str(export), *paths], cwd=REPO, env=clean_env(),
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


FARES = REPO / "examples" / "fares"
FARES_COLUMNS = {"distance_km": float, "passengers": int, "hour": int, "payment_type": str, "pickup_zone": str}


@pytest.fixture(scope="module")
def fares_export(tmp_path_factory):
    """The fares example's export (a regression on a table's columns, nothing of cassava), trained
    briefly on this machine, and instances made from its evaluation rows as a client sends them."""
    import csv

    root = tmp_path_factory.mktemp("fares-serving")
    env = clean_env(PYTHONPATH=f"{REPO}{os.pathsep}{FARES}")
    made = run_module("fares.generate", "--out", str(root / "data"), "--files", "2", "--rows", "200", "--eval-rows", "6",
                      env=env)
    assert made.returncode == 0, made.stderr[-2000:]
    trained = run_module("fares.task", "--train-files", str(root / "data" / "train-*.csv"), "--eval-files",
                         str(root / "data" / "eval-*.csv"), "--epochs", "1", "--steps-per-epoch", "5",
                         "--per-replica-batch-size", "16", "--model-dir", str(root / "model"), env=env)
    assert trained.returncode == 0, trained.stderr[-3000:]
    with open(root / "data" / "eval-00000-of-00001.csv", newline="") as rows:
        instances = [{name: kind(row[name]) for name, kind in FARES_COLUMNS.items()} for row in csv.DictReader(rows)]
    (root / "instances.jsonl").write_text("".join(json.dumps(instance) + "\n" for instance in instances))
    return root / "model", root / "instances.jsonl"


def close(a, b, tolerance: float = 1e-4) -> bool:
    """The same answer, numbers within `tolerance` of each other (relative above 1): the image's
    TensorFlow and this machine's run the same export on different CPUs' kernels."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(close(a[k], b[k], tolerance) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(close(x, y, tolerance) for x, y in zip(a, b))
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return abs(a - b) <= tolerance * max(1.0, abs(b))
    return a == b


def test_the_same_image_answers_for_the_fares_export_as_serving_predict_does(engine, serving_image, fares_export,
                                                                             tmp_path):
    """The prediction image is no cassava server: the server that answers for cassava's images
    (above) reads another model's signature, a table's five columns in and `fare` out, and answers
    for it, as serving.predict does here on the same instances."""
    model, instances_file = fares_export
    request = tmp_path / "request.json"
    written = run_module("serving.predict", str(model), "--instances", str(instances_file), "--vertex-request")
    assert written.returncode == 0, written.stderr[-2000:]
    request.write_text(written.stdout)
    artifacts = "gs://serving-models/fares/1/model"
    tool, _ = engine
    result = subprocess.run([PYTHON, "scripts/deploy_model.py", "local", "--engine", tool, "--image-uri", serving_image,
                             "--display-name", "fares", "--artifact-uri", artifacts, "--stage", f"{model}={artifacts}",
                             "--request", str(request)], cwd=REPO, env=user_env(), capture_output=True, text=True,
                            timeout=900)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    answer = json.loads(lines(result.stdout, "response", "200")[0])["predictions"]
    local = predicted_here(model, "--instances", str(instances_file))
    assert len(answer) == len(local) == 6
    assert all(close(a, b) for a, (_, b) in zip(answer, local)), (answer, local)
    loaded = [line for line in lines(result.stdout, "model") if "serving: model loaded from gs://" in line]
    assert len(loaded) == 1 and "fare" in loaded[0], lines(result.stdout, "model")
    assert lines(result.stdout, "model", "ERROR") == [], result.stdout[-3000:]
    assert leftovers(engine) == []


def test_every_bad_request_is_one_line_and_the_next_good_one_is_answered_in_the_image(engine, serving_image, export):
    process = subprocess.Popen(rehearsal(engine, serving_image, export, "--", *LIMITS), cwd=REPO, env=user_env(),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen: list[str] = []
    ready = threading.Event()

    def read():
        for line in process.stdout:
            seen.append(line)
            if re.match(r"local-run\s+INFO\s+ready: http://127\.0\.0\.1:\d+/", line):
                ready.set()
        ready.set()
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert ready.wait(600) and process.poll() is None, "".join(seen)[-4000:] + (process.stderr.read() if process.poll() is not None else "")
        port = int(re.search(r"ready: http://127\.0\.0\.1:(\d+)/", "".join(seen)).group(1))
        server = Server(process, port)
        good = photos(3, seed=11)
        for name, body, headers, status, message in BAD_REQUESTS:
            answered, answer = server.predict(bad_body(name, body, good), headers)
            assert answered == status and answer["error"].startswith(message), (name, answer)
            assert "Traceback" not in answer["error"] and "\n" not in answer["error"]
            after, predictions = server.predict(request_body(good))
            assert after == 200 and len(predictions["predictions"]) == 3, (name, predictions)
        # An idle client holds up no one, and a body over the limit is refused by its length alone.
        idle = raw_connection(server)
        oversized = raw_connection(server)
        oversized.sendall(b"POST " + PREDICT.encode() + b" HTTP/1.1\r\nHost: x\r\nContent-Length: 50000000\r\n\r\n{")
        assert oversized.recv(65536).startswith(b"HTTP/1.1 413 ")
        assert server.predict(request_body(good[:1]))[0] == 200
        idle.close(), oversized.close()
        # Published on this machine's loopback only, as the engine itself reports the binding.
        tool, env = engine
        names = [n for n in sh(tool, "ps", "--format", "{{.Names}}", env=env).stdout.split() if n.startswith("rehearsal-")]
        bindings = {sh(tool, "port", name, env=env).stdout.strip() for name in names}
        assert f"8080/tcp -> 127.0.0.1:{port}" in bindings, bindings
        process.send_signal(signal.SIGTERM)  # a user's Ctrl-C or kill: the model is undeployed
        process.wait(timeout=300)
    finally:
        if process.poll() is None:  # a failed assertion: the rehearsal still cleans up after itself
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=300)
            except subprocess.TimeoutExpired:
                process.kill()
        reader.join(timeout=30)
    err = process.stderr.read()
    output = "".join(seen)
    assert process.returncode == 130, output[-3000:] + err[-2000:]
    assert any(line.startswith("undeployed: ") and line.endswith("with exit code 0") for line in lines(output, "local-run")), output[-2000:]
    assert leftovers(engine) == []
