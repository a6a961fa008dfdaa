"""Runs a whole multi-worker job on one machine, one process per task, each running COMMAND.

    python -m trainer.launch --replicas N [--evaluator] [--timeout S] -- COMMAND [ARGS]
    python -m trainer.launch --workers N --ps M [--evaluator] [--timeout S] -- COMMAND [ARGS]

COMMAND is any program that reads its cluster from TF_CONFIG: `python -m mypackage.task FLAGS`,
`python -m trainer.fit --task MODULE FLAGS`, `python my_script.py`. A leading `python` or
`python3` runs this launcher's own interpreter, so the tasks see the same packages.

With --replicas it is a MultiWorkerMirrored job of N training replicas: chief-0 plus worker-0 ..
worker-(N-2). With --ps it is a ParameterServer job: chief-0 coordinates, N workers and M
parameter servers serve. --evaluator adds the side-car evaluator-0. The counts are named for what
they count: --workers is always the workers besides the chief, as submit_job.py's --workers, a
JobSet's or TFJob's Worker replicas and Vertex AI's worker pool 1 count them; --replicas counts
every process that trains, the chief included. (`--workers N` without --ps, which used to mean N
replicas, still does, with a line saying to write --replicas N.)

Each task gets its own TF_CONFIG, naming free localhost ports, and its own scratch directory
(TMPDIR, the hypertune metrics file), as if it ran on a machine of its own. Every output line
is prefixed with the task's name; the known-harmless lines TensorFlow's runtime prints in every
task (trainer/process/relay.py) are left out and counted at the end (--all-logs keeps them).

The job ends as a cluster job does:
- a synchronous job fails as soon as any task fails: the others are stopped;
- a ParameterServer job lives and dies with its coordinator. A worker that exits is started
  again, at most 3 times, and rejoins: what Vertex AI does for a replica lost to VM maintenance
  (`submit_job.py local --maintenance`), and a JobSet for a PSS worker's pod. It is not Vertex's
  rule for a replica that exits non-zero by itself: that fails the whole job on Vertex, and the
  rehearsal (scripts/rehearsal/vertex.py) applies it. Here the restart lets a test kill a worker
  and see the coordinator carry on;
- once the chief has finished, servers are stopped and the evaluator's last evaluation is
  awaited.

This is the one runner of processes, apart from the rehearsal's runner of containers on purpose:
it lives in the trainer package, which the images carry, needs no container engine and nothing
of scripts/, and is what the integration tests run jobs with.
Tasks are stopped as the platforms stop them: SIGTERM, then SIGKILL after --grace-period
seconds, so a trainer can save a backup and exit on its own (exit 143, trainer.exits). A task
killed by a signal is reported as 128 + the signal, as a shell would. Killing the launcher
itself (SIGTERM, Ctrl-C) stops every task at once, like a machine that goes away.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from typing import Sequence

from trainer import cli, exits, outputs
from trainer.process import ports, relay, stopping

# Like a Spot VM's notice (about 30 s), shortened: the trainer saves its backup within seconds.
DEFAULT_GRACE_SECONDS = 20.0
MAX_WORKER_RESTARTS = 3
WORKER_RESTART_DELAY_SECONDS = 2


@dataclasses.dataclass(frozen=True)
class TaskSpec:
    task_type: str
    index: int

    @property
    def name(self) -> str:
        return f"{self.task_type}-{self.index}"


def plan_cluster(workers: int, ps: int, evaluator: bool, ports: Sequence[int]) -> tuple[dict, list[TaskSpec]]:
    """The TF_CONFIG cluster and the task list. `ports` must hold one port per task."""
    if ps:
        counts = {"chief": 1, "worker": workers, "ps": ps}
    else:
        counts = {"chief": 1, "worker": workers - 1}
    tasks = [TaskSpec(kind, i) for kind, n in counts.items() for i in range(n)]
    addresses = iter(f"localhost:{port}" for port in ports)
    cluster = {kind: [next(addresses) for _ in range(n)] for kind, n in counts.items() if n}
    if evaluator:
        tasks.append(TaskSpec("evaluator", 0))
    return cluster, tasks


def tf_config(cluster: dict, task: TaskSpec) -> str:
    return json.dumps({"cluster": cluster, "task": {"type": task.task_type, "index": task.index}})


class Job:
    def __init__(self, cluster: dict, tasks: list[TaskSpec], command: list[str], work_dir: str, parameter_server: bool,
                 grace: float = DEFAULT_GRACE_SECONDS, all_logs: bool = False):
        self.cluster = cluster
        self.tasks = tasks
        self.command = command
        self.work_dir = work_dir
        self.parameter_server = parameter_server
        self.grace = grace
        self.all_logs = all_logs
        self.hidden_lines = 0
        self.hidden_progress = 0
        self.processes: dict[str, subprocess.Popen] = {}
        self.restarts: dict[str, int] = {}
        # Servers (PSS workers and ps) stopped because training was done: how such a job ends on
        # every platform, so the report reads it as success, not as their SIGTERM's 143.
        self.stopped_when_done: set[str] = set()
        self.print_lock = threading.Lock()
        self.readers: list[threading.Thread] = []
        self.launch_id = uuid.uuid4().hex

    def say(self, message: str) -> None:
        with self.print_lock:
            print(f"[launch] {message}", flush=True)

    def start(self, task: TaskSpec) -> None:
        scratch = os.path.join(self.work_dir, task.name)
        os.makedirs(os.path.join(scratch, "tmp"), exist_ok=True)
        env = dict(os.environ)
        env.pop("CLUSTER_SPEC", None)
        env["TF_CONFIG"] = tf_config(self.cluster, task)
        env["TMPDIR"] = os.path.join(scratch, "tmp")
        env["CLOUD_ML_HP_METRIC_FILE"] = os.path.join(scratch, "hypertune", "output.metrics")
        env["PYTHONUNBUFFERED"] = "1"
        # Tells this launch's run from an earlier one's (trainer/runtime/ownership.py).
        env[outputs.LAUNCH_ID] = self.launch_id
        process = subprocess.Popen(
            self.command,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            errors="replace",
            start_new_session=True,  # our signals reach it only through us
        )
        self.processes[task.name] = process
        reader = threading.Thread(target=self._relay, args=(task.name, process), daemon=True)
        reader.start()
        self.readers.append(reader)
        self.say(f"started {task.name} (pid {process.pid})")

    def _relay(self, name: str, process: subprocess.Popen) -> None:
        lines = relay.Filter()
        # Every MultiWorkerMirrored worker runs the same steps as the chief: its progress lines
        # would repeat the chief's, once per worker.
        repeats_the_chief = name.startswith("worker-") and not self.parameter_server
        for line in process.stdout:
            if self.all_logs:
                pass
            elif not lines.keep(line):
                self.hidden_lines += 1
                continue
            elif repeats_the_chief and relay.is_progress(line):
                self.hidden_progress += 1
                continue
            with self.print_lock:
                sys.stdout.write(f"[{name}] {line}" if line.endswith("\n") else f"[{name}] {line}\n")
                sys.stdout.flush()

    def stop(self, names: Sequence[str], grace: float) -> None:
        """SIGTERM, then SIGKILL after `grace` seconds (0: SIGKILL at once)."""
        stopping.stop([self.processes[n] for n in names], grace, group=True)

    def execute(self, timeout: float | None) -> int:
        """Starts every task and supervises them until the job ends; returns its exit code."""
        for task in self.tasks:
            self.start(task)
        deadline = time.monotonic() + timeout if timeout else None
        interrupted = True
        try:
            code = self._supervise(deadline)
            interrupted = False
        finally:
            # Interrupted (SIGTERM/SIGINT to the launcher): the machine is going away, as in a
            # preemption, so the tasks die at once, mid-step.
            self.stop(list(self.processes), grace=0 if interrupted else self.grace)
            for reader in self.readers:
                reader.join(timeout=5)
            if self.hidden_lines:
                self.say(f"hid {self.hidden_lines} known-harmless TensorFlow lines (trainer/process/relay.py says why; "
                         f"--all-logs shows them)")
            if self.hidden_progress:
                self.say(f"hid {self.hidden_progress} progress lines of the workers, which repeat the chief's "
                         f"(--all-logs shows them)")
            self.say("task exit codes: " + " ".join(f"{name}={self.outcome(name)}" for name in self.processes))
        return code

    def outcome(self, name: str) -> str:
        """A task's exit code for the report; `stopped` for a server the launcher stopped once
        training was done, when that stop is what ended it (SIGTERM's 143, or 0)."""
        code = exit_code(self.processes[name].returncode)
        if name in self.stopped_when_done and code in (exits.OK, exits.RETRYABLE):
            return "stopped"
        return str(code)

    def _supervise(self, deadline: float | None) -> int:
        # Tasks whose failure ends the job, and tasks that only serve until training is done.
        if self.parameter_server:
            training = ["chief-0"]
            servers = [t.name for t in self.tasks if t.task_type in ("ps", "worker")]
        else:
            training = [t.name for t in self.tasks if t.task_type in ("chief", "worker")]
            servers = []
        evaluators = [t.name for t in self.tasks if t.task_type == "evaluator"]
        by_name = {t.name: t for t in self.tasks}
        chief_done = False
        while True:
            if deadline and time.monotonic() > deadline:
                self.say("timeout: stopping every task")
                return 124
            for name, process in list(self.processes.items()):
                code = process.poll()
                if code is None:
                    continue
                if name in training or name in evaluators:
                    if code != 0:
                        code = exit_code(code)
                        self.say(f"{name} failed with exit code {code}: stopping every task "
                                 f"(SIGTERM, SIGKILL after {self.grace:g}s)")
                        return code
                elif not chief_done and name in servers:
                    if by_name[name].task_type == "worker" and self.restarts.get(name, 0) < MAX_WORKER_RESTARTS:
                        self.restarts[name] = self.restarts.get(name, 0) + 1
                        self.say(f"{name} exited with code {code}; restarting it ({self.restarts[name]}/{MAX_WORKER_RESTARTS})")
                        time.sleep(WORKER_RESTART_DELAY_SECONDS)
                        self.start(by_name[name])
                    elif by_name[name].task_type == "ps":
                        # The coordinator sees this and fails with its own message.
                        self.say(f"{name} exited with code {code}; parameter servers are not restarted")
                        servers.remove(name)
            if not chief_done and all(self.processes[n].poll() == 0 for n in training):
                chief_done = True
                if servers:
                    self.say("training finished: stopping the servers")
                    self.stopped_when_done.update(servers)
                    self.stop(servers, grace=self.grace)
                if evaluators:
                    self.say("waiting for the evaluator's last evaluation")
            if chief_done and all(self.processes[n].poll() is not None for n in evaluators):
                return max((self.processes[n].returncode for n in evaluators), default=0)
            time.sleep(0.2)


def exit_code(returncode: int | None) -> int | None:
    """A process killed by signal N reports 128 + N, as a shell (and a container) would."""
    return None if returncode is None else exits.of_process(returncode)


def build_parser() -> argparse.ArgumentParser:
    parser = cli.OneLineParser(
        prog="python -m trainer.launch",
        description="Run a multi-worker job locally: every task runs the command after --, with its own TF_CONFIG.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    counts = parser.add_mutually_exclusive_group(required=True)
    counts.add_argument("--replicas", type=cli.positive_int,
                        help="a MultiWorkerMirrored job of this many training processes, the chief included")
    counts.add_argument("--workers", type=cli.positive_int,
                        help="with --ps: the workers besides the chief, as submit_job.py's --workers counts them")
    parser.add_argument("--ps", type=cli.non_negative_int, default=0, help="parameter servers")
    parser.add_argument("--evaluator", action="store_true", help="add a side-car evaluator task")
    parser.add_argument("--timeout", type=float, default=None, help="stop everything after this many seconds (exit 124)")
    parser.add_argument("--grace-period", type=float, default=DEFAULT_GRACE_SECONDS,
                        help="seconds between SIGTERM and SIGKILL when tasks are stopped, as a platform gives them")
    parser.add_argument("--all-logs", action="store_true",
                        help="also relay the known-harmless TensorFlow lines every task prints (trainer/process/relay.py)")
    parser.add_argument("--work-dir", default=None,
                        help="per-task scratch dirs (TMPDIR, hypertune metrics); default a temp dir, removed at the end")
    parser.add_argument("command", nargs=argparse.REMAINDER,
                        help="-- then the command every task runs, e.g. python task.py --epochs 1")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    command = relay.with_this_python(args.command[1:] if args.command[:1] == ["--"] else args.command)
    if not command:
        parser.error("no command: give it after --, e.g. -- python task.py --epochs 1")
    if args.ps and args.replicas:
        parser.error(f"--replicas counts a MultiWorkerMirrored job; with --ps give --workers {args.replicas}, the workers "
                     "besides the chief")
    # plan_cluster's count: without --ps the replicas, chief included; with --ps the workers besides it.
    count = args.workers if args.ps else args.replicas or args.workers
    cluster_size = 1 + (count + args.ps if args.ps else count - 1)
    cluster, tasks = plan_cluster(count, args.ps, args.evaluator, ports.free_ports(cluster_size, "localhost"))
    work_dir = args.work_dir or tempfile.mkdtemp(prefix="trainer-launch-")
    os.makedirs(work_dir, exist_ok=True)
    job = Job(cluster, tasks, command, work_dir, parameter_server=bool(args.ps), grace=args.grace_period,
              all_logs=args.all_logs)
    if args.workers and not args.ps:
        job.say(f"--workers {args.workers} without --ps: {args.workers} training replicas, the chief included, as "
                f"before; write --replicas {args.workers} (--workers counts the workers besides the chief, as "
                "submit_job.py does)")
    job.say(f"cluster {json.dumps(cluster)}; scratch in {work_dir}")

    def on_signal(signum, _frame):
        raise KeyboardInterrupt(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, on_signal)
    try:
        code = job.execute(args.timeout)
    except KeyboardInterrupt as interrupt:
        job.say(f"interrupted ({interrupt}): tasks stopped")
        code = 130
    finally:
        if not args.work_dir:
            shutil.rmtree(work_dir, ignore_errors=True)
    job.say(f"exit code {code}")
    return code
