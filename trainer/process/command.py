"""Runs your own training command, unchanged, with what the platform left unprepared:

    python -m trainer.run [--log-format auto|plain|json] -- COMMAND [ARGS...]

e.g. `python -m trainer.run -- python task.py --epochs 3`, `... -- python -m mypackage.train`,
`... -- bash -c 'python prepare.py && python task.py'`. A leading `python` or `python3` is the
interpreter this runner runs on (sys.executable), not whatever PATH finds: a virtualenv's python
called by its path runs COMMAND in the same virtualenv, activated or not. Before COMMAND starts:

- TF_CONFIG is set from whatever describes the cluster here (trainer.cluster): Vertex AI's
  TF_CONFIG or CLUSTER_SPEC, with Reduction Server reducers left out of the cluster; AI Platform's
  `master`, renamed `chief`; a Kubeflow TFJob's; a JobSet pod's JOBSET_* variables, which give no
  TF_CONFIG at all. So `tf.distribute.MultiWorkerMirroredStrategy()` finds its cluster on every
  platform. A single process gets none. An evaluator keeps a TF_CONFIG naming itself (task type
  `evaluator`) beside the training cluster, which TensorFlow accepts without the evaluator listed
  in it (tensorflow/python/distribute/multi_worker_util.py, _validate_cluster_spec, 2.21).
- AIP_MODEL_DIR, AIP_CHECKPOINT_DIR and AIP_TENSORBOARD_LOG_DIR are set where the platform did
  not set them (trainer.outputs: beside output/model locally, per trial during tuning), so a
  script that reads them, as Vertex AI's documentation asks, works on a JobSet and locally too.
- The directory holding the runtime's package is appended to PYTHONPATH, so that a script may
  import `trainer.loop.fit_model` (docs/keras.md) wherever this runner runs it; then
  trainer/process/exit_hook, whose `sitecustomize` makes the end of COMMAND's Python processes
  orderly with the job's other tasks when they run MultiWorkerMirroredStrategy
  (trainer.library.ending.at_exit: no task left behind logs TensorFlow's coordination-service
  errors), and runs any `sitecustomize` it hides.

While it runs, COMMAND's stderr is read line by line and written at its Cloud Logging severity
(trainer.process.severity: INFO lines to stdout; JSON entries in a Kubernetes pod), without the
known-harmless lines TensorFlow's runtime prints (trainer.process.relay). Its stdout is its own. The
signals a platform sends (SIGTERM before a stop, SIGINT, ...) are forwarded to COMMAND's process
group; if this runner is killed outright (SIGKILL), COMMAND dies with it.

It exits as trainer/exits.py's contract says: COMMAND's own exit code; 128 + N when a signal N
ended it (SIGTERM: 143, which the platforms retry); 143 when COMMAND failed in any way after a
SIGTERM was forwarded to it (a script may catch it and exit 1: the cause is still the stop), or
when a Python process of it ended on an uncaught error that says a peer of its cluster is gone
(trainer.process.peer_loss: a chief whose worker was preempted);
127 when COMMAND is not found and 126 when it cannot be executed, as a shell says, with one line;
2 with one line when the cluster description or the flags are unusable.

When COMMAND fails with one of the errors trainer/process/relay.py lists in KNOWN_FAILURES (a dataset
with fewer files than workers under tf.distribute's default sharding), one line of this runner's
own follows TensorFlow's, saying what to change. One of its KNOWN_EXCEPTIONS (Keras 3's
`model.fit` across workers, keras-team/keras#20585) is said in that line alone: the traceback and
the batch its message prints are left out.

When the environment names a model directory (AIP_MODEL_DIR: Vertex AI's, or your own) and
COMMAND exits 0 on the task that saves (the chief, or a single process) having left it empty, one
warning line says so: Vertex AI makes a Model from that directory only, and a script that saved
elsewhere, or not at all, would otherwise pass without a word (the SageMaker training toolkit
warns alike). It looks at a local directory, and at a gs:// one where Cloud Storage FUSE shows
its bucket under /gcs/ (as on Vertex AI); elsewhere it cannot look and says nothing. The default
this runner sets locally (output/model) is not checked: a command given `--model-dir` saves where
that says.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import signal
import subprocess
import sys
import threading
from typing import Mapping, Sequence

import trainer
from trainer import cli, exits, outputs
from trainer.process import relay, severity
from trainer import cluster as cluster_lib

AUTO = "auto"
# Set in every Kubernetes pod (the API server's service): where a one-line JSON object is read as
# a structured entry by GKE's logging agent.
KUBERNETES_VARIABLE = "KUBERNETES_SERVICE_HOST"
NOT_FOUND, NOT_EXECUTABLE = 127, 126
# Where Vertex AI's Cloud Storage FUSE shows gs://BUCKET/PATH: /gcs/BUCKET/PATH.
FUSE_ROOT = "/gcs"
# The directory that holds the `trainer` package.
RUNTIME_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(trainer.__file__)))
# A folder of one module, sitecustomize.py, and nothing else that could shadow a script's names.
EXIT_HOOK = os.path.join(os.path.dirname(os.path.abspath(__file__)), "exit_hook")


def child_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment COMMAND runs in: `environ` with TF_CONFIG from the resolved cluster and the
    AIP_* output directories. `environ` must hold HOSTNAME (cluster.environ_with_hostname) for a
    JobSet pod. Raises cluster.ClusterConfigError (str() one line) for an unusable cluster."""
    cluster = cluster_lib.resolve(environ)
    env = dict(environ)
    if cluster.tf_config is None:
        env.pop("TF_CONFIG", None)  # one process: `{}`, or one task of a single-replica job
    else:
        env["TF_CONFIG"] = json.dumps(cluster.tf_config)
    dirs = outputs.resolve_dirs(None, None, None, environ, cluster.trial)
    env["AIP_MODEL_DIR"] = dirs.model_dir
    env["AIP_CHECKPOINT_DIR"] = dirs.checkpoint_dir
    env["AIP_TENSORBOARD_LOG_DIR"] = dirs.tensorboard_dir
    # The runtime's own package, last on the path: a script can call trainer.loop.fit_model
    # wherever trainer.run runs it (the images have it on PYTHONPATH already), and the script's
    # own modules still come first.
    paths = [path for path in env.get("PYTHONPATH", "").split(os.pathsep) if path]
    # Then the exit hook, whose sitecustomize makes a multi-worker script's end orderly
    # (trainer.library.ending); a sitecustomize of the script's own, earlier on the path, still wins.
    env["PYTHONPATH"] = os.pathsep.join([*paths, *(path for path in (RUNTIME_ROOT, EXIT_HOOK) if path not in paths)])
    return env


def left_empty(model_dir: str, fuse_root: str = FUSE_ROOT) -> bool | None:
    """Whether the model directory holds nothing (missing counts as empty); None where this
    runner cannot look: a gs:// path whose bucket no Cloud Storage FUSE mount shows."""
    path = model_dir
    if model_dir.startswith("gs://"):
        bucket = model_dir[len("gs://"):].split("/", 1)[0]
        if not bucket or not os.path.isdir(os.path.join(fuse_root, bucket)):
            return None
        path = os.path.join(fuse_root, model_dir[len("gs://"):])
    elif "://" in model_dir:
        return None
    try:
        return not os.listdir(path)
    except FileNotFoundError:
        return True
    except OSError:
        return None


def empty_model_warning(code: int, model_dir: str | None, fuse_root: str = FUSE_ROOT) -> str | None:
    """The warning for an exit 0 that left `model_dir` empty, else None; `model_dir`: the one to
    check (main says which), or None."""
    if code != exits.OK or not model_dir or not left_empty(model_dir, fuse_root):
        return None
    return (f"trainer.run: warning: the command exited 0 and left the model directory empty (AIP_MODEL_DIR={model_dir}); "
            "save the trained model there: Vertex AI makes a Model from that directory only")


def log_format(requested: str, environ: Mapping[str, str]) -> str:
    if requested != AUTO:
        return requested
    return severity.JSON if environ.get(KUBERNETES_VARIABLE) else severity.PLAIN


def exit_status(returncode: int, terminated: bool) -> int:
    """The runner's exit code for COMMAND's `returncode` (subprocess's: -N for signal N);
    `terminated`: a SIGTERM was forwarded to it."""
    code = exits.of_process(returncode)
    if terminated and code != exits.OK:
        return exits.RETRYABLE
    return code


def supervise(command: Sequence[str], env: Mapping[str, str], log_format_name: str, saved_to: str | None = None) -> int:
    """Runs COMMAND to its end as the module docstring says; returns the exit code. `saved_to`:
    the model directory an exit 0 must have left something in, else a warning says so."""
    child: subprocess.Popen | None = None
    pending: list[int] = []
    terminated = False

    def forward(signum, _frame):
        nonlocal terminated
        terminated = terminated or signum == signal.SIGTERM
        if child is None:
            pending.append(signum)  # arrived while COMMAND was being started
            return
        try:
            os.killpg(child.pid, signum)
        except ProcessLookupError:
            pass

    for signum in relay.FORWARDED_SIGNALS:
        signal.signal(signum, forward)
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    parent = os.getpid()
    try:
        child = subprocess.Popen(list(command), env=dict(env), stdin=None, stdout=None, stderr=subprocess.PIPE,
                                 process_group=0, preexec_fn=lambda: relay.die_with_parent(parent))
    except FileNotFoundError:
        print(f"trainer.run: {command[0]}: command not found", file=sys.stderr, flush=True)
        return NOT_FOUND
    except OSError as error:  # not executable, not a program (no #! line), ...
        print(f"trainer.run: {command[0]}: cannot execute: {error.strerror}", file=sys.stderr, flush=True)
        return NOT_EXECUTABLE
    for signum in pending:
        forward(signum, None)

    writer = severity.Writer(sys.stdout.fileno(), sys.stderr.fileno(), log_format_name)
    failures: list[str] = []  # what KNOWN_FAILURES says of the errors seen, in order
    reader = threading.Thread(target=_copy, args=(child.stderr, writer, failures), daemon=True)
    reader.start()
    returncode = child.wait()
    # What COMMAND wrote before it exited is in the pipe: read at once. Only a process it left
    # behind, still holding the pipe, keeps the reader longer.
    reader.join(timeout=relay.DRAIN_SECONDS)
    code = exit_status(returncode, terminated)
    if code != exits.OK and failures:
        writer.entry(severity.ERROR, f"trainer.run: the command failed: {failures[0]}")
    warning = empty_model_warning(code, saved_to)
    if warning:
        writer.entry(severity.WARNING, warning)
    writer.close()
    return code


def _copy(stream: io.BufferedReader, writer: severity.Writer, failures: list[str]) -> None:
    lines, tracebacks = relay.Filter(), relay.Tracebacks()
    for raw in stream:  # the last line comes too, with or without its newline
        text = severity.decode(raw)
        if not lines.keep(text):
            continue
        for line in tracebacks.feed(text):
            writer.line(line)
            failure = relay.known_failure(line)
            if failure and failure not in failures:
                failures.append(failure)
    for line in tracebacks.flush():
        writer.line(line)
    if tracebacks.found and tracebacks.found not in failures:
        failures.insert(0, tracebacks.found)


def build_parser() -> argparse.ArgumentParser:
    parser = cli.OneLineParser(
        prog="python -m trainer.run",
        description="Run your own training command with TF_CONFIG, the AIP_* output directories, stderr at its "
                    "Cloud Logging severity, signals forwarded and the exit code mapped (trainer/exits.py).",
        usage="python -m trainer.run [--log-format auto|plain|json] -- COMMAND [ARGS...]")
    parser.add_argument("--log-format", choices=(AUTO, severity.PLAIN, severity.JSON), default=AUTO,
                        help="plain: INFO lines of stderr to stdout, the rest on stderr; json: one Cloud Logging "
                        "entry per line (GKE's agent reads its severity); auto: json in a Kubernetes pod, else plain")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    split = argv.index("--") if "--" in argv else len(argv)
    options, command = argv[:split], argv[split + 1:]
    args = build_parser().parse_args(options)
    if not command:
        print("trainer.run: error: no command: give it after --, e.g. python -m trainer.run -- python task.py",
              file=sys.stderr)
        return exits.CONFIG
    environ = cluster_lib.environ_with_hostname(os.environ)
    try:
        env = child_environment(environ)
        saves = cluster_lib.resolve(environ).is_chief
    except cluster_lib.ClusterConfigError as error:
        print(f"trainer.run: error: {error}", file=sys.stderr)
        return exits.CONFIG
    saved_to = env["AIP_MODEL_DIR"] if saves and environ.get("AIP_MODEL_DIR") else None
    return supervise(relay.with_this_python(command), env, log_format(args.log_format, os.environ), saved_to)
