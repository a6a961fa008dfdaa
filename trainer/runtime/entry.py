"""Runs a `trainer.tasks.Task` in every process of a job, whatever its role.

    python -m trainer.fit --task PACKAGE.MODULE[:CLASS] [runtime flags] [the task's flags]

or, from a task module's own `__main__`, `trainer.fit.run(MyTask())`.

It resolves who this process is (TF_CONFIG, CLUSTER_SPEC, a JobSet pod's variables), parses the
runtime's flags and the task's, sets the process environment TensorFlow reads at start-up, and
hands over to the code for its role:

| role                                   | runs (trainer/runtime/roles/)          |
|----------------------------------------|----------------------------------------|
| chief or worker, synchronous strategy  | synchronous.train                      |
| chief of a ParameterServerStrategy job | parameter_server.train (coordinator)   |
| worker or ps of such a job             | parameter_server.serve                 |
| evaluator                              | evaluator.evaluate                     |

Configuration and data errors end the process with one line on stderr and exit code 2
(trainer.exits has the whole contract). In the images the command runs under `python -m
trainer.run`, which relays its stderr at Cloud Logging's severity.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import sys
from typing import Sequence

from trainer import cluster as cluster_lib
from trainer import exits
from trainer.library import ending
from trainer.runtime import config as config_lib
from trainer.runtime import heap, logs, storage
from trainer.runtime import strategy as strategy_lib
from trainer.tasks import DataError, Task

log = logging.getLogger("trainer")


class StartupError(RuntimeError):
    """Found before training starts (an unwritable output); str() is one line."""


def prepare_environment(cluster: cluster_lib.Cluster, strategy_name: str, environ) -> None:
    """The variables TensorFlow reads once, at start-up. Must run before TensorFlow is imported."""
    environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    for key, value in storage.CLIENT_ENVIRONMENT.items():
        environ.setdefault(key, value)
    if cluster.tf_config is None or cluster.task_type == cluster_lib.EVALUATOR:
        # The evaluator is not part of the training cluster and must not try to join it.
        environ.pop("TF_CONFIG", None)
    else:
        environ["TF_CONFIG"] = json.dumps(cluster.tf_config)
    if strategy_name == "parameter_server":
        # Lets the coordinator see a lost worker as an error it can retry elsewhere, instead of
        # RPCs waiting forever (TensorFlow's ParameterServerStrategy guide).
        environ["GRPC_FAIL_FAST"] = "use_caller"


def check_writable(*paths: str) -> None:
    """Fails early, with one line, when an output directory cannot be created or written."""
    import tensorflow as tf

    for path in paths:
        try:
            tf.io.gfile.makedirs(path)
            probe = f"{path.rstrip('/')}/.write-probe-{os.getpid()}"
            with tf.io.gfile.GFile(probe, "w") as handle:
                handle.write("ok")
            tf.io.gfile.remove(probe)
        except (tf.errors.OpError, OSError) as error:
            verdict = storage.failure(error)
            if verdict and verdict[0] == exits.RETRYABLE:
                raise  # Cloud Storage is down, not the path wrong: main reports it as retryable
            message = getattr(error, "message", None) or str(error)
            raise StartupError(f"cannot write to {path}: {message.splitlines()[0]}") from None


def program_name(task: Task) -> str:
    """How the command was started, for --help and error lines: `python -m mypackage.task`, or
    `task.py` for a script."""
    module = type(task).__module__
    if module == "__main__":
        spec = getattr(sys.modules["__main__"], "__spec__", None)
        if spec is None or not spec.name:
            return os.path.basename(sys.argv[0]) or "python"
        module = spec.name.removesuffix(".__main__")
    return f"python -m {module}"


def build_parser(task: Task, prog: str | None = None) -> argparse.ArgumentParser:
    """The command line `main` parses for `task`: the runtime's flags and the task's (--help)."""
    return config_lib.build_parser(task, prog or program_name(task))[0]


def main(task: Task, argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    """Trains `task` in this process's role; returns the exit code (trainer.exits)."""
    logs.configure()
    prog = prog or program_name(task)
    name = prog.removeprefix("python -m ")
    try:
        # HOSTNAME from the kernel when the environment lacks it: a JobSet pod checks its
        # cluster against its own hostname.
        cluster = cluster_lib.resolve(cluster_lib.environ_with_hostname(os.environ))
        config = config_lib.parse(argv, os.environ, cluster, task, prog)
    except (cluster_lib.ClusterConfigError, config_lib.ConfigError, DataError) as error:
        print(f"{name}: error: {error}", file=sys.stderr)
        return 2
    strategy_name = strategy_lib.choose(config.strategy, cluster)
    log.info("cluster: %s", cluster.to_json())
    log.info("role: %s, strategy: %s, model dir: %s", cluster.task_name, strategy_name, config.model_dir)
    prepare_environment(cluster, strategy_name, os.environ)

    # TensorFlow is imported from here on, once prepare_environment has set what it reads at start-up.
    heap.import_frozen("tensorflow", "keras")
    from trainer.library.backup import BackupMismatch
    from trainer.runtime import ownership

    try:
        # Every task, before anything writes: makedirs under a missing bucket never returns.
        storage.check_buckets([config.model_dir, config.checkpoint_dir, config.tensorboard_dir,
                               *task.input_paths(config.task_flags)])
        if trains_model(cluster, strategy_name):
            if cluster.is_chief:
                check_writable(config.model_dir, config.checkpoint_dir)
            task.fetch(config.task_flags)  # before the cluster forms: a failure is one line in each task
        # This job's own place for its state: never another job's backup or checkpoints.
        config = ownership.settle(config, cluster, type(task).__qualname__, strategy_name, os.environ)
        code = _run_role(task, config, cluster, strategy_name, name)
        if code == 0:
            ownership.finish(config, cluster)
        return code
    except (StartupError, DataError, config_lib.ConfigError, storage.StorageError, BackupMismatch,
            ownership.StateError) as error:
        print(f"{name}: error: {error}", file=sys.stderr)
        return 2
    except Exception as error:
        verdict = storage.failure(error)
        if verdict is None:
            raise
        code, line = verdict
        print(f"{name}: error: {line}", file=sys.stderr)
        return code


def trains_model(cluster: cluster_lib.Cluster, strategy_name: str) -> bool:
    """Whether this process builds the model to train it: every task of a synchronous job, a
    ParameterServer job's coordinator; not its workers and parameter servers, nor the evaluator."""
    if cluster.task_type == cluster_lib.EVALUATOR:
        return False
    return strategy_name != "parameter_server" or cluster.is_chief


def _run_role(task: Task, config: config_lib.TrainConfig, cluster: cluster_lib.Cluster, strategy_name: str,
              name: str) -> int:
    if cluster.task_type == cluster_lib.EVALUATOR:
        from trainer.runtime.roles import evaluator

        return evaluator.evaluate(task, config, cluster, name)
    if strategy_name == "parameter_server":
        from trainer.runtime.roles import parameter_server

        if cluster.task_type in (cluster_lib.WORKER, cluster_lib.PS):
            if cluster.task_type == cluster_lib.WORKER:
                # Workers run the coordinator's dataset function themselves: whatever it reads
                # must be there on this machine too (a task that generates its data makes it here).
                task.prepare(config.task_flags)
            return parameter_server.serve(cluster)
        return parameter_server.train(task, config, cluster, name)

    from trainer.runtime.roles import synchronous

    return synchronous.train(task, config, cluster, strategy_name, name)


def load_task(reference: str) -> Task:
    """`package.module` (its `task` attribute, else its only Task subclass) or
    `package.module:Name` (a Task subclass or instance) -> a Task."""
    module_name, _, attribute = reference.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise DataError(f"--task {reference}: cannot import {module_name} ({error})") from None
    if attribute:
        found = getattr(module, attribute, None)
        if found is None:
            raise DataError(f"--task {reference}: {module_name} has no {attribute}")
    elif isinstance(getattr(module, "task", None), Task):
        found = module.task
    else:
        classes = [value for value in vars(module).values()
                   if isinstance(value, type) and issubclass(value, Task) and value is not Task
                   and value.__module__ == module.__name__]
        if len(classes) != 1:
            raise DataError(f"--task {reference}: {module_name} defines {len(classes)} Task subclasses; "
                            f"name one as {module_name}:CLASS")
        found = classes[0]
    task = found() if isinstance(found, type) else found
    if not isinstance(task, Task):
        raise DataError(f"--task {reference}: {type(task).__name__} is not a trainer.tasks.Task")
    return task


def run(task: Task, argv: Sequence[str] | None = None) -> None:
    """A task module's `__main__`: the task in this process's role; exits with main's code, in
    order with the job's other tasks and without the interpreter's teardown (trainer.library.ending)."""
    ending.leave(ending.end(main(task, argv)))


def command_line() -> int:
    """`python -m trainer.fit --task PACKAGE.MODULE[:CLASS] FLAGS`: loads the task, then `main`."""
    argv = sys.argv[1:]
    reference = None
    for i, arg in enumerate(argv):
        if arg == "--task" and i + 1 < len(argv):
            reference = argv[i + 1]
            argv = argv[:i] + argv[i + 2:]
            break
        if arg.startswith("--task="):
            reference = arg.split("=", 1)[1]
            argv = argv[:i] + argv[i + 1:]
            break
    if not reference:
        print("python -m trainer.fit: error: --task PACKAGE.MODULE[:CLASS] is required (--help of a task: "
              "python -m trainer.fit --task MODULE --help)", file=sys.stderr)
        return 2
    try:
        task = load_task(reference)
    except DataError as error:
        print(f"python -m trainer.fit: error: {error}", file=sys.stderr)
        return 2
    return main(task, argv, prog=f"python -m trainer.fit --task {reference}")
