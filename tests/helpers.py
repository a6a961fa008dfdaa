"""Helpers shared by the test tiers: a clean environment and subprocess runners."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# Figures tests measure but never assert on (sizes, build times); conftest prints them at the end.
BUDGETS: list[str] = []


def clean_env(**overrides) -> dict[str, str]:
    """The test process's environment without any cluster or Vertex variables, plus overrides."""
    drop = ("TF_CONFIG", "CLUSTER_SPEC", "CLOUD_ML_TRIAL_ID", "CLOUD_ML_HP_METRIC_FILE",
            "AIP_MODEL_DIR", "AIP_CHECKPOINT_DIR", "AIP_TENSORBOARD_LOG_DIR")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["PYTHONPATH"] = str(REPO)
    env.update(overrides)
    return env


def parents() -> dict[int, int]:
    """pid -> parent pid of every process on this machine (from /proc)."""
    found = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    # The command name, in parentheses, may hold spaces: the fields after it are fixed.
                    found[int(entry)] = int(stat.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass  # gone meanwhile
    return found


def run_processes() -> set[int]:
    """This test run's processes: the run's first one (pytest-xdist's controller, when this process is
    one of its workers) and everything started under it, other workers' tests included. A process
    whose parent exited is handed to init, outside this set: what a test leaves behind is not in it."""
    root = os.getppid() if os.environ.get("PYTEST_XDIST_WORKER") else os.getpid()
    children: dict[int, list[int]] = {}
    for pid, parent in parents().items():
        children.setdefault(parent, []).append(pid)
    found, pending = set(), [root]
    while pending:
        pid = pending.pop()
        found.add(pid)
        pending += [child for child in children.get(pid, ()) if child not in found]
    return found


# Float32, for the training runs of tests whose subject is not precision (issue 53). Under the
# default, auto, a CPU with bfloat16 instructions (AVX512-BF16 or AMX) first times the task's model
# in float32 and in bfloat16 and trains in whichever wins by trainer.precision's margin: on a CPU
# without them, float32 with no timing. So the same test trained in one policy or the other by the
# machine CI drew (a 2-worker ResNet50 job here timed x1.16 against a margin of x1.15, two tasks
# timing on the same 2 cores), and each task paid for the timing: about 0.5 CPU s of a small job's
# task, 6 of a ResNet50 one's. The precision tests (test_precision_runs.py and the runs that ask for
# bfloat16) and the tests of what a default job prints (test_quiet_stderr.py, test_stderr.py) keep
# their own.
FLOAT32 = ["--mixed-precision", "off"]

# The real ResNet50 at 64 px, 8 images per replica, 2 epochs of 8 steps, no pretrained weights:
# a fraction of a second a step, on local generated JPEGs that decode in about a millisecond.
RESNET50_TWO_WORKERS = ["--architecture", "resnet50", "--weights", "none", "--image-size", "64",
                        "--per-replica-batch-size", "8", "--dataset", "synthetic:64", "--epochs", "2",
                        "--steps-per-epoch", "8", *FLOAT32]


def run_module(module: str, *args: str, env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, env=env or clean_env(),
                          capture_output=True, text=True, timeout=timeout)


def launch_cassava(root: Path, *args: str, ps: int = 0, env: dict | None = None,
                   timeout: int = 500) -> subprocess.CompletedProcess:
    """cassava.task with `args` as 2 workers (and `ps` parameter servers) through trainer.launch,
    its work dir root/work and its model dir root/out/model; `timeout`: trainer.launch's, a guard
    against a hung job (this process waits a minute more for the launcher's own report)."""
    roles = ["--workers", "2"] + (["--ps", str(ps)] if ps else [])
    return run_module("trainer.launch", *roles, "--work-dir", str(root / "work"), "--timeout", str(timeout), "--",
                      "python", "-m", "cassava.task", *args, "--model-dir", str(root / "out" / "model"),
                      env=env, timeout=timeout + 60)


def run_main(main, *args: str) -> subprocess.CompletedProcess:
    """A command's `main(argv)` run in this process, as run_module would run the command: its exit
    code and what it printed. For the unit tier, which starts no process."""
    import contextlib
    import io

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as stop:  # argparse's --help and its errors
            code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    return subprocess.CompletedProcess(list(args), code, out.getvalue(), err.getvalue())


def launch_until(args, pattern: str, action, env: dict | None = None, module: str = "trainer.launch") -> tuple[int, str]:
    """Runs `module` (trainer.launch) with `args`; when an output line matches `pattern`, calls
    action(output so far, the process). Returns the exit code and all output."""
    launcher = subprocess.Popen([sys.executable, "-m", module, *args], cwd=REPO, env=env or clean_env(),
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen = []
    try:
        for line in launcher.stdout:
            seen.append(line)
            if re.match(pattern, line):
                action("".join(seen), launcher)
                break
        rest = launcher.communicate(timeout=540)[0]
    finally:
        launcher.kill()
    return launcher.returncode, "".join(seen) + rest


# Python defining stored_and_used(path): the values a SavedModel's checkpoint stores, and the values
# of the variables its signatures use (each variable once). A script that loads an export appends
# it, so that a test can hold the export to each weight stored once (trainer/library/export.py).
STORED_AND_USED = """
def stored_and_used(path):
    import numpy as np, tensorflow as tf
    reader = tf.train.load_checkpoint(path.rstrip("/") + "/variables/variables")
    stored = sum(int(np.prod(shape)) for name, shape in reader.get_variable_to_shape_map().items()
                 if not name.startswith("_CHECKPOINTABLE_OBJECT_GRAPH"))
    loaded = tf.saved_model.load(path)  # held: its functions' variables live as long as it does
    used = {}
    for function in loaded.signatures.values():
        for variable in function.variables:
            used[id(variable)] = int(np.prod(variable.shape))
    return stored, sum(used.values())
"""


_OP_DTYPES_SCRIPT = """
import json, sys
import trainer, tensorflow as tf
loaded = tf.saved_model.load(sys.argv[1])
graph = loaded.signatures["serving_default"].graph.as_graph_def()
nodes = list(graph.node) + [n for f in graph.library.function for n in f.node_def]
dtypes = {}
for node in nodes:
    if node.op in ("Conv2D", "MatMul", "Softmax", "FusedBatchNormV3") and "T" in node.attr:
        dtypes.setdefault(node.op, set()).add(tf.dtypes.as_dtype(node.attr["T"].type).name)
print(json.dumps({op: sorted(types) for op, types in dtypes.items()}))
"""


def saved_model_op_dtypes(model_dir) -> dict[str, list[str]]:
    """The dtypes the exported model's serving graph computes Conv2D, MatMul and Softmax in,
    read from the SavedModel's own graph (what serving will run), in a fresh process."""
    return _json_from_script(_OP_DTYPES_SCRIPT, model_dir)


def _json_from_script(script: str, path) -> object:
    """The JSON last line `script` prints for `path`, run in a fresh process (TensorFlow stays out
    of the test process)."""
    import json

    result = subprocess.run([sys.executable, "-c", script, str(path)], cwd=REPO, env=clean_env(),
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


_TRAINING_LOG_SCRIPT = """
import glob, json, sys
import trainer, tensorflow as tf
ops, policies = {}, {}

def layers(config):
    for layer in config.get("config", {}).get("layers", []):
        yield layer
        yield from layers(layer)

for path in glob.glob(sys.argv[1] + "/events.out.tfevents.*"):
    for event in tf.compat.v1.train.summary_iterator(path):
        if event.graph_def:
            graph = tf.compat.v1.GraphDef.FromString(event.graph_def)
            for node in list(graph.node) + [n for f in graph.library.function for n in f.node_def]:
                if node.op in ("Conv2D", "Conv2DBackpropFilter", "MatMul", "Softmax") and "T" in node.attr:
                    ops.setdefault(node.op, set()).add(tf.dtypes.as_dtype(node.attr["T"].type).name)
        for value in event.summary.value:
            if value.tag == "keras":
                for layer in layers(json.loads(tf.make_ndarray(value.tensor).item())):
                    dtype = layer.get("config", {}).get("dtype")  # a policy, or a plain name ("float32")
                    if dtype:
                        name = dtype["config"]["name"] if isinstance(dtype, dict) else dtype
                        policies.setdefault(layer["class_name"], set()).add(name)
print(json.dumps([{k: sorted(v) for k, v in found.items()} for found in (ops, policies)]))
"""


def _training_log(log_dir) -> tuple[dict, dict]:
    ops, policies = _json_from_script(_TRAINING_LOG_SCRIPT, log_dir)
    return ops, policies


def train_graph_op_dtypes(log_dir) -> dict[str, list[str]]:
    """The dtypes the train step computes Conv2D (forward and, as Conv2DBackpropFilter, backward),
    MatMul and Softmax in, read from the graph Keras' TensorBoard callback wrote to `log_dir`
    (the job's logs/train), in a fresh process: what the job trained in (the export is float32)."""
    ops, _ = _training_log(log_dir)
    assert ops, f"no train graph in {log_dir}"
    return ops


def trained_model_policies(log_dir) -> dict[str, list[str]]:
    """Layer class -> the dtype policies of its layers in the model Keras' TensorBoard callback
    described in `log_dir`: the model the job built, where no train graph is written (a
    ParameterServerStrategy coordinator's callback writes none)."""
    _, policies = _training_log(log_dir)
    assert policies, f"no model description in {log_dir}"
    return policies


_SERVE_SCRIPT = """
import json, sys
import numpy as np
import trainer, tensorflow as tf
from cassava import synthetic
rng = np.random.default_rng(0)
photos = [tf.io.encode_jpeg(synthetic.make_image(rng, i % 5, size=(120 + 40 * i, 160))).numpy() for i in range(int(sys.argv[2]))]
outputs = tf.saved_model.load(sys.argv[1]).signatures["serving_default"](image_bytes=tf.constant(photos))
print(json.dumps({"class_name": [n.decode() for n in outputs["class_name"].numpy()],
                  "class_index": outputs["class_index"].numpy().tolist(),
                  "probabilities": outputs["probabilities"].numpy().tolist()}))
"""


def served_predictions(model_dir, count: int = 4) -> dict:
    """What the exported model's serving_default answers for `count` generated JPEG photos of
    several sizes, sent as bytes, in a fresh process (as a server would load it)."""
    import json

    result = subprocess.run([sys.executable, "-c", _SERVE_SCRIPT, str(model_dir), str(count)], cwd=REPO, env=clean_env(),
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


# What the trainer's log says about backups and epochs (trainer.library.backup, trainer.runtime.callbacks).
# In a launcher's output each line starts with [task-name]; task=None reads one process's own.
def _prefix(task: str | None) -> str:
    return rf"\[{task}\] " if task else ""


def epochs_begun(output: str, task: str | None = "chief-0") -> list[int]:
    return [int(n) for n in re.findall(rf"^{_prefix(task)}.*trainer: epoch (\d+)/\d+ begins$", output, re.M)]


def backups_reported(output: str, task: str | None = "chief-0") -> list[tuple[int, int]]:
    return [(int(e), int(s)) for e, s in re.findall(
        rf"^{_prefix(task)}.*trainer: backup saved in \d+\.\ds: a restart resumes at epoch (\d+) step (\d+)$", output, re.M)]


def resumed_at(output: str, task: str | None = "chief-0") -> tuple[int, int] | None:
    match = re.search(rf"^{_prefix(task)}.*trainer: resumed from backup at epoch (\d+) step (\d+)$", output, re.M)
    return (int(match.group(1)), int(match.group(2))) if match else None


def write_image_folder(root: Path, per_class: int = 8) -> Path:
    """A folder per class of small JPEGs, as a user's own images would come (cassava.prepare's folder: source)."""
    import numpy as np

    import trainer  # noqa: F401  (first: it sets TensorFlow's environment)
    import tensorflow as tf
    from cassava import synthetic

    rng = np.random.default_rng(0)
    for label, name in enumerate(synthetic.CLASS_NAMES):
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            image = synthetic.make_image(rng, label, size=(60, 80))
            (root / name / f"{i}.jpg").write_bytes(tf.io.encode_jpeg(image).numpy())
    return root


def assert_bad_data_stop_said(stderr: str) -> None:
    """A `--max-bad-examples 3` stop on stderr: each image skipped named, then the job's own line,
    last and the only error line, and no traceback."""
    lines = stderr.splitlines()
    assert lines[-1] == ("cassava.task: error: more than 3 undecodable images in one pass over this task's data "
                         "(--max-bad-examples); the images skipped are named above"), stderr[-3000:]
    assert [line for line in lines if "cassava.task: error:" in line] == lines[-1:]
    assert len([line for line in lines if re.search(r'trainer: skipping undecodable image "broken-\d"', line)]) >= 3
    assert "Traceback" not in stderr
