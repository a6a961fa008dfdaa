"""The images, built and run for real: lint, build, structure tests, the SBOM against the disk,
training inside a container as its unprivileged user, a 2-container MultiWorkerMirrored job, and a
push to and pull from a local registry.

Needs a container engine: docker with a daemon, or podman + buildah (scripts/supply_chain/install_image_tools.sh).
On machines that cannot pull base images, the images are built on scripts/supply_chain/standin_base.sh's
Debian base; set BASE_IMAGE to use another.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import time
import uuid

import pytest

from containers import SMALL_TRAINING, build_env, sh
from helpers import BUDGETS, REPO
from parallel import ENGINE

# They run no rehearsal and retag no shared image: beside the rehearsals, on any worker (tests/parallel.py);
# the structure tests excepted (STRUCTURE_TESTS).
pytestmark = pytest.mark.no_rehearsal
# `images.sh test` writes its report to a path of the machine's and serves the Docker API from a podman
# service that the test below looks for on the whole machine: every structure test of the tier runs on
# the rehearsals' worker, one at a time (tests/container/test_serving_image.py's too).
STRUCTURE_TESTS = pytest.mark.xdist_group(ENGINE)

# Each image the tests build, by the fixture that builds it (tests/container/conftest.py).
FIXTURES = {"tf-runtime-cpu": "runtime_cpu_image", "tf-runtime-gpu": "runtime_gpu_image",
            "cassava-trainer-cpu": "cpu_image", "cassava-trainer-gpu": "gpu_image", "tf-predictor-cpu": "serving_image"}
DOCKERFILES = {"tf-runtime-cpu": "Dockerfile.cpu", "tf-runtime-gpu": "Dockerfile.gpu",
               "cassava-trainer-cpu": "images/cassava/Dockerfile", "cassava-trainer-gpu": "images/cassava/Dockerfile",
               "tf-predictor-cpu": "images/serving/Dockerfile"}


def writable_by_the_images_user(*paths) -> None:
    """The images run as uid 1000: a host folder they write to is opened to it, as a volume's
    securityContext.fsGroup does on Kubernetes."""
    for path in paths:
        os.chmod(path, 0o777)


def test_dockerfiles_pass_hadolint():
    result = sh("hadolint", "--config", ".hadolint.yaml", *sorted(set(DOCKERFILES.values())), check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def podman_services(env) -> str:
    """The podman services started from this machine's images work folder, one per line."""
    listing = subprocess.run(["pgrep", "-af", "podman system service"], capture_output=True, text=True).stdout
    return "\n".join(line for line in listing.splitlines() if env["IMAGES_WORK"] in line)


@pytest.fixture(scope="module")
def structure_runs(engine, runtime_cpu_image, cpu_image):
    """`images.sh test` of tf-runtime-cpu, then (under podman) of cassava-trainer-cpu, with a dead
    socket left at the shared path first: after each run, the image, its structure-test report and,
    under podman, the services and sockets left behind. Shared by test_structure_tests_pass for
    those two images and test_structure_tests_leave_no_podman_service_behind (issue 53): the second
    run, which shows that a run works after another as well as the first, was a second run of
    tf-runtime-cpu's 23 tests; it is now cassava-trainer-cpu's own, which its structure test
    needed anyway, so the same checks take one run of the CPU runtime's tests fewer."""
    tool, env = engine
    if tool == "podman":
        stale = os.path.join(env["IMAGES_WORK"], "podman.sock")  # a shared path, with nothing serving it
        if not os.path.exists(stale):
            with socket.socket(socket.AF_UNIX) as leftover:
                leftover.bind(stale)
    runs = []
    for image in ["tf-runtime-cpu", "cassava-trainer-cpu"] if tool == "podman" else ["tf-runtime-cpu"]:
        sh("scripts/supply_chain/images.sh", "test", image, env={**env, "TAG": "test"})
        with open(os.path.join(env["IMAGES_WORK"], f"structure-{image}.json")) as report_file:
            report = json.load(report_file)
        runs.append({"image": image, "report": report, "services": podman_services(env) if tool == "podman" else "",
                     "sockets": [name for name in os.listdir(env["IMAGES_WORK"])
                                 if name.startswith("podman-") and name.endswith(".sock")]})
    return runs


@STRUCTURE_TESTS
@pytest.mark.parametrize("image", ["tf-runtime-cpu", "tf-runtime-gpu", "cassava-trainer-cpu", "cassava-trainer-gpu"])
def test_structure_tests_pass(image, request, engine):
    """tf-runtime-cpu's and, under podman, cassava-trainer-cpu's reports are structure_runs' (shared
    with the test below)."""
    shared = {run["image"]: run["report"] for run in request.getfixturevalue("structure_runs")} \
        if image in ("tf-runtime-cpu", "cassava-trainer-cpu") else {}
    if image in shared:
        report = shared[image]
    else:
        request.getfixturevalue(FIXTURES[image])
        _, env = engine
        sh("scripts/supply_chain/images.sh", "test", image, env={**env, "TAG": "test"})
        with open(os.path.join(env["IMAGES_WORK"], f"structure-{image}.json")) as report_file:
            report = json.load(report_file)
    assert report["Fail"] == 0 and report["Pass"] >= 8, report
    assert any(r["Name"].startswith("Command Test") for r in report["Results"])  # command tests really ran


@STRUCTURE_TESTS
def test_structure_tests_leave_no_podman_service_behind(engine, structure_runs):
    """A podman service left running fails every later structure test: its socket outlives it, or
    it outlives the checkout it was started from ("write child: broken pipe"). So each run of
    scripts/supply_chain/images.sh starts its own service and stops it, and a dead socket left behind at the
    shared path must not be picked up. The two runs are structure_runs' (shared with
    test_structure_tests_pass for their two images)."""
    tool, _ = engine
    if tool != "podman":
        pytest.skip("only podman serves the Docker API from a service the script starts")
    assert len(structure_runs) == 2
    for run in structure_runs:
        assert run["services"] == ""
        assert run["sockets"] == []
        assert run["report"]["Fail"] == 0


def test_the_image_names_read_from_podmans_store_record_are_the_ones_buildah_lists(engine, runtime_cpu_image):
    """Engine.image_names reads podman's store record (scripts/rehearsal/engine.py) instead of
    running a listing command; on the tier's real store it names what `buildah images` names. Other
    tests add and remove tags meanwhile, so a name the record held before and after buildah's
    listing must be in it, and every name buildah listed must be in one of the two reads."""
    from scripts.rehearsal.engine import Engine

    tool, env = engine
    if tool != "podman":
        pytest.skip("docker keeps no containers/storage record")
    listing = Engine(tool, env)
    if listing.images_record is None:
        pytest.fail(f"podman info names no store record this code reads: {listing.run('info').stdout[-500:]}")

    def tagged(names):
        return {name for name in names if not name.startswith("<none>")}

    before = tagged(listing.image_names())
    for _ in range(240):  # buildah's listing fails while images are removed under it (the docstring above)
        listed = listing._listing()  # noqa: SLF001 (the command's own listing, to compare)
        if listed.returncode == 0:
            break
        time.sleep(0.5)
    assert listed.returncode == 0, listed.stderr[-2000:]
    after = tagged(listing.image_names())
    by_buildah = tagged(listed.stdout.split())
    assert runtime_cpu_image in before, sorted(before)[:20]
    assert before & after <= by_buildah, sorted((before & after) - by_buildah)
    assert by_buildah <= before | after, sorted(by_buildah - (before | after))


@pytest.mark.parametrize("image", ["tf-runtime-cpu", "tf-runtime-gpu", "cassava-trainer-cpu", "tf-predictor-cpu"])
def test_print_image_sizes(image, request, base_image):
    request.getfixturevalue(FIXTURES[image])
    report = sh("scripts/supply_chain/images.sh", "size", image, env=build_env(base_image)).stdout
    BUDGETS.append(report.rstrip())
    size = float(re.search(r"([\d.]+) GB uncompressed", report).group(1))
    assert size > 0.5  # a real TensorFlow image, not an empty one
    # its own layers are listed, the one that installs its locked packages among them
    assert re.search(r"^  [\d.]+ [kMG]B\t.*(image_steps\.sh venv|pip install)", report, re.M), report
    below = f"localhost/tf-runtime-cpu:test" if image == "cassava-trainer-cpu" else base_image
    assert f"layers of {below} left out" in report


# The sentence of docs/images.md that states the GPU image's budget: the test reads the number there,
# so the page and the check cannot drift apart.
GPU_BUDGET = re.compile(r"The GPU image's own layers are about ([\d.]+) GB, against a budget of ([\d.]+) GB")


def gpu_budget_gb() -> float:
    match = GPU_BUDGET.search((REPO / "docs" / "images.md").read_text())
    assert match, "docs/images.md no longer states the GPU image's budget in the sentence this test reads"
    return float(match.group(2))


def test_the_gpu_images_own_layers_fit_the_budget_docs_images_md_states(engine, runtime_gpu_image, base_image):
    # Its own layers, what every new node pulls: the image less its base (here the stand-in base, in
    # production nvidia/cuda's, which nodes mostly have cached). Decimal GB, as `images.sh size` prints.
    tool, env = engine

    def size(image: str) -> int:
        return int(sh(tool, "image", "inspect", "--format", "{{.Size}}", image, env=env).stdout.strip())

    own_gb = (size(runtime_gpu_image) - size(base_image)) / 1e9
    BUDGETS.append(f"GPU image's own layers: {own_gb:.2f} GB (budget {gpu_budget_gb()} GB, docs/images.md)")
    assert own_gb <= gpu_budget_gb(), f"the GPU image's own layers are {own_gb:.2f} GB, over the {gpu_budget_gb()} GB budget"


def test_training_inside_the_cpu_image_writes_the_model_to_the_host(engine, cpu_image, tmp_path):
    tool, env = engine
    out = tmp_path / "out"
    out.mkdir()
    writable_by_the_images_user(out)
    sh(tool, "run", "--rm", "--init", "-v", f"{out}:/out", cpu_image, *SMALL_TRAINING, "--model-dir", "/out/model", env=env)
    assert (out / "model" / "saved_model.pb").exists()
    assert {"checkpoints", "logs", "model"} <= set(os.listdir(out))


def test_training_inside_the_cpu_image_writes_to_a_bucket_at_googles_hostnames(engine, cpu_image, gcs_server):
    """The image's TensorFlow reaches the local Cloud Storage server as it would Cloud Storage:
    only the proxy, the CA and the AIP_* variables Vertex AI sets are passed in."""
    tool, env = engine
    gcs_server.create_bucket("container-job")
    run = [tool, "run", "--rm", "--init", "--network", "host",  # the proxy listens on the host's loopback
           "-v", f"{gcs_server.ca}:/etc/local-gcs-ca.pem:ro"]
    for key, value in gcs_server.environ().items():
        run += ["-e", f"{key}={'/etc/local-gcs-ca.pem' if key == 'CURL_CA_BUNDLE' else value}"]
    for key, directory in (("AIP_MODEL_DIR", "model"), ("AIP_CHECKPOINT_DIR", "checkpoints"),
                           ("AIP_TENSORBOARD_LOG_DIR", "logs")):
        run += ["-e", f"{key}=gs://container-job/job/{directory}/"]
    sh(*run, cpu_image, *SMALL_TRAINING, env=env)
    names = gcs_server.list("container-job", "job/")
    assert {"job/model/saved_model.pb", "job/checkpoints/epoch-1.index"} <= set(names), names
    assert any(name.startswith("job/logs/train/events.out.tfevents.") for name in names), names


def test_two_container_multi_worker_job(engine, cpu_image, tmp_path):
    tool, env = engine
    network = f"cassava-{uuid.uuid4().hex[:8]}"
    names = {"chief": f"{network}-chief", "worker": f"{network}-worker"}
    cluster = {"chief": [f"{names['chief']}:2222"], "worker": [f"{names['worker']}:2222"]}
    out, worker_tmp = tmp_path / "out", tmp_path / "worker-tmp"
    out.mkdir(), worker_tmp.mkdir()
    writable_by_the_images_user(tmp_path, out, worker_tmp)
    sh(tool, "network", "create", network, env=env)
    try:
        processes = {}
        for role, name in names.items():
            tf_config = json.dumps({"cluster": cluster, "task": {"type": role, "index": 0}})
            processes[role] = subprocess.Popen(
                [tool, "run", "--rm", "--init", "--name", name, "--network", network, "-e", f"TF_CONFIG={tf_config}",
                 "-e", "TMPDIR=/scratch", "-v", f"{out}:/out", "-v", f"{worker_tmp if role == 'worker' else tmp_path}:/scratch",
                 cpu_image, *SMALL_TRAINING, "--epochs", "2", "--model-dir", "/out/model", "--data-dir", "/scratch/data"],
                cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        outputs = {role: process.communicate(timeout=900)[0] for role, process in processes.items()}
        for role, process in processes.items():
            assert process.returncode == 0, f"{role}:\n{outputs[role][-3000:]}"
    finally:
        for name in names.values():
            sh(tool, "rm", "-f", name, env=env, check=False)
        sh(tool, "network", "rm", "-f", network, env=env, check=False)
    assert "replicas=2" in outputs["chief"]
    assert (out / "model" / "saved_model.pb").exists()
    # Both trained the same weights, and the chief alone exported them: the worker wrote no copy.
    weights = {role: re.findall(r"trainer: trained 2 epochs of 2 steps; weights ([0-9a-f]+) \(every worker's are the same\)$",
                                output, re.M) for role, output in outputs.items()}
    assert len(weights["chief"]) == 1 and weights["chief"] == weights["worker"], weights
    assert "exported" not in outputs["worker"] and "saved model" not in outputs["worker"], outputs["worker"][-2000:]
    assert [p for p in os.listdir(worker_tmp) if p.startswith("model-")] == []  # nor a temporary one


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def local_registry(tmp_path):
    binary = shutil.which("docker-registry")
    assert binary, "Debian's docker-registry is not installed (scripts/supply_chain/install_image_tools.sh)"
    port = free_port()
    config = tmp_path / "registry.yml"
    config.write_text(f"version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: {tmp_path / 'storage'}\n"
                      f"http:\n  addr: 127.0.0.1:{port}\n")
    registry = subprocess.Popen([binary, "serve", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            assert time.monotonic() < deadline and registry.poll() is None, "local registry did not start"
            time.sleep(0.2)
    yield f"127.0.0.1:{port}"
    registry.terminate()
    registry.wait(timeout=30)


def test_push_to_a_registry_and_pull_back_by_digest(engine, runtime_cpu_image, local_registry):
    tool, env = engine
    pushed = sh("scripts/supply_chain/images.sh", "push", "tf-runtime-cpu", f"{local_registry}/trainers",
                env={**env, "TAG": "test", "INSECURE_REGISTRY": "1"}).stdout.strip().splitlines()[-1]
    assert re.fullmatch(rf"{re.escape(local_registry)}/trainers/tf-runtime-cpu@sha256:[0-9a-f]{{64}}", pushed), pushed
    local_id = sh(tool, "image", "inspect", "--format", "{{.Id}}", runtime_cpu_image, env=env).stdout.strip()
    sh(tool, "rmi", "-f", pushed, env=env, check=False)
    pull = [tool, "pull"] + (["--tls-verify=false"] if tool == "podman" else []) + [pushed]
    sh(*pull, env=env)
    pulled_id = sh(tool, "image", "inspect", "--format", "{{.Id}}", pushed, env=env).stdout.strip()
    assert pulled_id == local_id


def test_trainer_only_change_reuses_the_dependency_layer(base_image, runtime_cpu_image, tmp_path):
    """A copy of the build context with one trainer file changed: the pip layer comes from cache."""
    context = tmp_path / "context"
    files = sh("git", "ls-files", "Dockerfile.cpu", ".dockerignore", "trainer", "images", "scripts").stdout.split()
    for name in files:
        (context / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, context / name)
    (context / "trainer" / "fit.py").write_text((REPO / "trainer" / "fit.py").read_text() + f"\n# change {uuid.uuid4()}\n")
    started = time.monotonic()
    result = subprocess.run(["scripts/supply_chain/images.sh", "build", "tf-runtime-cpu"], cwd=context, capture_output=True, text=True,
                            env={**build_env(base_image), "TAG": "rebuild", "REVISION": "test"}, timeout=1800)
    seconds = time.monotonic() - started
    assert result.returncode == 0, result.stderr[-3000:]
    BUDGETS.append(f"CPU runtime image rebuild after a trainer-only change: {seconds:.1f}s")
    lines = (result.stdout + result.stderr).splitlines()

    def cached(marker):
        step = next(i for i, line in enumerate(lines) if marker in line)
        return any("Using cache" in line or "CACHED" in line for line in lines[step:step + 2])

    assert cached("image_steps.sh venv"), "the dependency layer was rebuilt"
    assert not cached("COPY --chown=root:root trainer"), "the changed trainer code was not copied"


def test_selfcheck_in_the_gpu_image_reports_the_locked_stack_and_trains_on_cpu(engine, runtime_gpu_image):
    """No GPU here: the image's own check must still show the CUDA stack it carries, say that no
    GPU is visible, and run the ResNet50 train steps on the CPU."""
    tool, env = engine
    # The image's own command, as `docker run IMAGE` runs it, under its entry point (trainer.run).
    command = json.loads(sh(tool, "image", "inspect", "--format", "{{json .Config.Cmd}}", runtime_gpu_image,
                            env=env).stdout)
    assert command == ["python", "-m", "trainer.selfcheck"]
    result = sh(tool, "run", "--rm", "--init", runtime_gpu_image, *command, "--image-size", "64", "--steps", "2",
                env=env, check=False)
    output = result.stdout
    assert result.returncode == 0, output[-3000:] + result.stderr[-3000:]
    BUDGETS.append("GPU image selfcheck on this CPU:\n" + "\n".join(
        line for line in output.splitlines() if line.startswith(("  cudnn", "  nccl", "  cudart", "resnet50", "multi_worker"))))
    assert re.search(r"^tensorflow 2\.21\.0: CUDA build for CUDA 12\.5\.1, cuDNN 9,", output, re.M)
    assert re.search(r"^  cudnn +9\.24\.0 +/opt/venv/.*/nvidia/cudnn/lib/libcudnn\.so\.9$", output, re.M)
    assert re.search(r"^  nccl +2\.30\.7 ", output, re.M)
    assert re.search(r"^  cudart +12\.9 ", output, re.M)
    assert "driver: none (libcuda.so.1 not found" in output
    assert "device: no GPU visible; the CPU part runs" in output
    assert re.search(r"^resnet50 train step, float32 +\d+\.\d images/s .*; first step \d+\.\d s, compiling\)$",
                     output, re.M)
    assert re.search(r"^  nccl-net +none ", output, re.M)  # no Reduction Server plugin in this image
    assert re.search(r"^multi_worker_mirrored: 1 worker, 1 local replica\(s\) \(CPU\), 3 steps, loss \d", output, re.M)
    assert output.rstrip().endswith("selfcheck ok")


def test_the_gpu_images_tensorflow_has_the_build_info_the_spec_builder_reads(engine, runtime_gpu_image):
    """images/gpu/tensorflow-build-info.json, from which scripts/jobspec/accelerators.py decides which GPUs
    JIT-compile, is what the image's own TensorFlow says of itself."""
    tool, env = engine
    script = ("import json, tensorflow as tf; "
              "print(json.dumps({'version': tf.__version__, 'build_info': dict(tf.sysconfig.get_build_info())}))")
    result = sh(tool, "run", "--rm", "--entrypoint", "python", runtime_gpu_image, "-c", script, env=env)
    image = json.loads(result.stdout.strip().splitlines()[-1])
    committed = json.loads((REPO / "images" / "gpu" / "tensorflow-build-info.json").read_text())
    assert image["version"] == committed["tensorflow"]
    assert image["build_info"] == committed["build_info"]
    assert image["build_info"]["cuda_compute_capabilities"], "a CUDA build lists its kernel architectures"


def test_gpu_stack_check_fails_on_a_cudnn_below_the_minimum(engine, runtime_gpu_image, tmp_path):
    """A wrong stack: a cuDNN 9.1 that the loader would find first (LD_LIBRARY_PATH beats the
    wheels' RUNPATH, as it would for a base image that puts its own cuDNN there). The library is
    built here and answers cudnnGetVersion() like the real 9.1.0; the check must refuse it."""
    if shutil.which("gcc") is None:
        pytest.skip("needs gcc to build the old-cuDNN library")
    tool, env = engine
    (tmp_path / "c.c").write_text("#include <stddef.h>\nsize_t cudnnGetVersion(void) { return 90100; }\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(tmp_path / "libcudnn.so.9"), str(tmp_path / "c.c")], check=True)
    os.chmod(tmp_path, 0o755)  # readable by the image's user, uid 1000: the loader skips what it cannot open
    result = sh(tool, "run", "--rm", "-v", f"{tmp_path}:/old-cudnn:ro", "-e", "LD_LIBRARY_PATH=/old-cudnn",
                "--entrypoint", "python", runtime_gpu_image, "-m", "trainer.gpu_stack", env=env, check=False)
    assert result.returncode == 1, result.stdout[-2000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("trainer.gpu_stack: error:")]
    assert len(errors) == 1, result.stderr[-2000:]
    assert "cudnn 9.1.0 at /old-cudnn/libcudnn.so.9 is older than 9.24.0" in errors[0]
    # and the same image, unchanged, passes: the failure came from the library, not the check
    assert sh(tool, "run", "--rm", "--entrypoint", "python", runtime_gpu_image, "-m", "trainer.gpu_stack",
              env=env).returncode == 0


