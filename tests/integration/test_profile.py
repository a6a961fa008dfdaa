"""--profile-steps: a 2-worker MultiWorkerMirrored job (real processes, trainer.launch) captures a
profiler trace of the steps asked for, and TensorBoard's profile plugin (xprof, pinned in the dev
lock) opens it and finds those steps.

The job runs with the plugin hidden from its Python (a directory first on PYTHONPATH whose
`xprof` and `tensorboard_plugin_profile` fail to import), as in the images, which do not carry
it: TensorFlow alone writes the trace.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys

import pytest

from helpers import FLOAT32, REPO, clean_env

SMALL_RUN = ["--architecture", "small", "--weights", "none", "--image-size", "32", "--per-replica-batch-size", "4", *FLOAT32]
STEPS_PER_EPOCH = 6
FIRST, LAST = 3, 5  # counted from 1, as the flag takes them

_STEP_MARKERS = """
import glob, json, sys
import trainer
from tensorflow.tsl.profiler.protobuf import xplane_pb2
found = []
for path in glob.glob(sys.argv[1] + "/plugins/profile/*/*.xplane.pb"):
    space = xplane_pb2.XSpace.FromString(open(path, "rb").read())
    for plane in space.planes:
        names = {key: meta.name for key, meta in plane.event_metadata.items()}
        stats = {key: meta.name for key, meta in plane.stat_metadata.items()}
        for line in plane.lines:
            for event in line.events:
                if names.get(event.metadata_id) == "train":
                    values = {stats[s.metadata_id]: s.int64_value for s in event.stats}
                    found.append([plane.name, values.get("epoch_num"), values.get("step_num")])
print(json.dumps(found))
"""

_TRACE_VIEWER = """
import json, sys
from xprof.convert import raw_to_tool_data
data, content_type = raw_to_tool_data.xspace_to_tool_data(sys.argv[1:], "trace_viewer", {"use_saved_result": False})
events = json.loads(data)["traceEvents"]
print(json.dumps(sorted({e["name"] for e in events if e.get("ph") == "X" and e.get("name", "").startswith("train ")})))
"""


def last_json_line(script: str, *args: str) -> object:
    result = subprocess.run([sys.executable, "-c", script, *args], cwd=REPO, env=clean_env(),
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def profiled_job(tmp_path_factory, data_root):
    tmp_path = tmp_path_factory.mktemp("profile")
    hidden = tmp_path / "no-profile-plugin"
    for package in ("xprof", "tensorboard_plugin_profile"):
        (hidden / package).mkdir(parents=True)
        (hidden / package / "__init__.py").write_text("raise ImportError('hidden: the images do not carry it')\n")
    env = clean_env(PYTHONPATH=f"{hidden}:{REPO}")
    result = subprocess.run(
        [sys.executable, "-m", "trainer.launch", "--workers", "2", "--work-dir", str(tmp_path / "work"), "--timeout", "500",
         "--", "python", "-m", "cassava.task", "--data-dir", str(data_root), "--dataset", "synthetic:64", "--epochs", "2", "--steps-per-epoch",
         str(STEPS_PER_EPOCH), *SMALL_RUN, "--model-dir", str(tmp_path / "out" / "model"),
         "--profile-steps", f"{FIRST}-{LAST}"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=560)
    assert result.returncode == 0, result.stdout[-4000:]
    return result.stdout, tmp_path / "out" / "logs"


def test_the_chief_traces_the_steps_asked_for_into_the_tensorboard_dir(profiled_job):
    output, logs = profiled_job
    traces = sorted((logs / "train" / "plugins" / "profile").glob("*/*.xplane.pb"))
    assert len(traces) == 1, sorted(str(p) for p in logs.rglob("*"))
    assert re.search(rf"^\[chief-0\] .*trainer: profiling steps {FIRST}-{LAST} into {re.escape(str(logs))}/train$", output, re.M)
    assert re.search(rf"^\[chief-0\] .*trainer: profile of steps {FIRST}-{LAST} written under ", output, re.M)
    # Keras marks each step in the trace ("train", its epoch and step numbers from 0): exactly
    # the steps asked for are in it, whole.
    markers = last_json_line(_STEP_MARKERS, str(logs / "train"))
    assert sorted((epoch, step) for _, epoch, step in markers) == [(0, step - 1) for step in range(FIRST, LAST + 1)]


def test_by_default_no_other_task_traces(profiled_job):
    output, logs = profiled_job
    assert sorted(p.name for p in logs.iterdir() if p.name.startswith("train")) == ["train"]
    assert not re.search(r"^\[worker-0\] .*trainer: profil", output, re.M)


def test_tensorboards_profile_plugin_opens_the_trace_and_shows_those_steps(profiled_job, tmp_path):
    _, logs = profiled_job
    trace = next((logs / "train" / "plugins" / "profile").glob("*/*.xplane.pb"))
    copy = tmp_path / trace.name  # the converter may write its cache beside the file
    shutil.copy(trace, copy)
    steps = last_json_line(_TRACE_VIEWER, str(copy))
    assert steps == [f"train {step - 1}" for step in range(FIRST, LAST + 1)]


def test_tensorboard_finds_the_profile_plugin():
    result = subprocess.run([sys.executable, "-c", "from importlib.metadata import entry_points; "
                             "print([e.value for e in entry_points(group='tensorboard_plugins')])"],
                            cwd=REPO, env=clean_env(), capture_output=True, text=True, timeout=60)
    assert "xprof.profile_plugin_loader:ProfilePluginLoader" in result.stdout, result.stdout + result.stderr


def test_the_chief_traces_into_a_bucket(tmp_path, data_root, gcs):
    """On Vertex AI the TensorBoard dir is AIP_TENSORBOARD_LOG_DIR, a gs:// path: TensorFlow
    writes the trace through its own GCS client (here to the local Cloud Storage server).
    (`--profile-tasks all` is left out: in 2 of 8 runs the worker tracing beside the chief died
    in TensorFlow with "double free or corruption"; docs/performance.md says so.)"""
    gcs.create_bucket("profiled-job")
    result = subprocess.run(
        [sys.executable, "-m", "trainer.launch", "--workers", "2", "--work-dir", str(tmp_path / "work"), "--timeout", "500",
         "--", "python", "-m", "cassava.task", "--data-dir", str(data_root), "--dataset", "synthetic:64", "--epochs", "1", "--steps-per-epoch",
         str(STEPS_PER_EPOCH), *SMALL_RUN, "--model-dir", str(tmp_path / "model"), "--profile-steps", "2"],
        cwd=REPO, env=clean_env(**gcs.environ(), AIP_TENSORBOARD_LOG_DIR="gs://profiled-job/logs/"),
        capture_output=True, text=True, timeout=560)
    assert result.returncode == 0, result.stdout[-4000:]
    traces = [name for name in gcs.list("profiled-job", "logs/") if name.endswith(".xplane.pb")]
    assert [name.split("/")[1] for name in traces] == ["train"], traces
    for name in traces:
        local = tmp_path / name
        (local.parent).mkdir(parents=True, exist_ok=True)
        local.write_bytes(gcs.download("profiled-job", name))
        run_dir = local.parent.parent.parent.parent  # RUN/plugins/profile/SESSION/HOST.xplane.pb
        assert [step for _, _, step in last_json_line(_STEP_MARKERS, str(run_dir))] == [1], name


def test_a_parameter_server_coordinator_traces_its_side_of_the_steps(tmp_path, data_root):
    """tf-keras refuses batch-level callbacks under ParameterServerStrategy unless they take
    their logs as they come: the coordinator's trace holds the steps it scheduled."""
    result = subprocess.run(
        [sys.executable, "-m", "trainer.launch", "--workers", "2", "--ps", "1", "--work-dir", str(tmp_path / "work"),
         "--timeout", "500", "--", "python", "-m", "cassava.task", "--data-dir", str(data_root), "--dataset", "synthetic:64", "--epochs", "1",
         "--steps-per-epoch", str(STEPS_PER_EPOCH), *SMALL_RUN, "--model-dir", str(tmp_path / "out" / "model"),
         "--profile-steps", f"{FIRST}-{LAST}"],
        cwd=REPO, env=clean_env(), capture_output=True, text=True, timeout=560)
    assert result.returncode == 0, result.stdout[-4000:]
    markers = last_json_line(_STEP_MARKERS, str(tmp_path / "out" / "logs" / "train"))
    assert sorted(step for _, _, step in markers) == [step - 1 for step in range(FIRST, LAST + 1)]
