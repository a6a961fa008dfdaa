"""Whose state a checkpoint directory holds: a job resumes only its own backup, writes only its own
checkpoints, and its evaluator reads only them.

The checkpoint directory (`--checkpoint-dir`, `$AIP_CHECKPOINT_DIR`, else `checkpoints` beside the
model dir) is a default two jobs can share: two jobs given model dirs in one parent directory
(docs/your-own-code.md's `/tmp/linefit/mwms` and `/tmp/linefit/pss`), or two Vertex AI jobs given
one base output directory. So the chief keeps a record there, `job.json`, saying which job the
state is (`identity`) and whether its run is training or finished, and every task works out the
same place for its job before anything reads or writes state (`place`):

- the directory itself when it is free or already this job's;
- `CHECKPOINT_DIR/jobs/KEY` when it holds another job's state (or state no record names), or
  when this job already has that place from an earlier start. One INFO line names both jobs.

The same job is the same command: the same task, the same flags that decide what is trained and
where it is saved (every runtime and task flag but those that only say how to run: backups,
profiling, evaluation, TensorBoard, the checkpoint dir itself), on the same number of training
tasks and parameter servers, in the same tuning trial. So a Vertex AI or JobSet restart, a Vertex
job resubmitted with the same spec and output directory, and a rerun of the same command locally
all find their backup and resume at its step; a command with any such flag changed (more epochs,
another learning rate, another --model-dir) or on another cluster is another job, and starts from
scratch in its own place. Two tuning trials are two jobs. docs/failures-and-restarts.md says why.

A rerun of a job that finished starts from scratch (its backup went when it finished): its chief
removes the earlier run's epoch checkpoints before training, so the evaluator never takes them for
the new run's. An evaluator waits for its chief's record of the run; one that finds the run
already finished evaluates that run's final checkpoint when the record carries the token of this
launch of the job (`LAUNCH_VARIABLES`: Vertex AI's job id, a JobSet's uid when its pods are given
it, trainer.launch's own), and when no token says otherwise.

Everything above the edges is pure (facts in, plain values out) and tested without TensorFlow.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import logging
import re
import time
import uuid
from typing import Any, Callable, Mapping

from trainer import outputs

log = logging.getLogger("trainer")

RECORD = "job.json"
OWN_PLACES = "jobs"
TRAINING, FINISHED = "training", "finished"
# What tells one launch of a job from another, first found wins: Vertex AI's id of the CustomJob
# (kept over its restarts and retries), a JobSet's uid (kept over its restarts; the pods have it
# as the label jobset.sigs.k8s.io/jobset-uid, given through the downward API), trainer.launch's.
LAUNCH_VARIABLES = ("CLOUD_ML_JOB_ID", "JOBSET_UID", outputs.LAUNCH_ID)
# TrainConfig fields that say how to run a job, not what it trains or where it saves: a rerun that
# changes one of them is the same job.
OPERATIONAL_FIELDS = frozenset({"backup_every_steps", "checkpoint_dir", "tensorboard_dir", "hypertune_metric",
                                "eval_timeout", "profile_steps", "profile_tasks", "validation_steps", "task_flags"})
KEY_LENGTH = 12
POLL_SECONDS = 2.0
# At most this many differences are named in the line about another job's state.
MAX_NAMED_DIFFERENCES = 4


class StateError(ValueError):
    """The job's state cannot be placed (an unwritable or unreadable directory). str() is one line."""


def _plain(value: Any) -> Any:
    """A flag's value as JSON, the same in every process and every restart: an object whose str()
    holds its memory address counts by its type alone."""
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    if isinstance(value, dict):
        return {str(key): _plain(item) for key, item in sorted(value.items(), key=lambda kv: str(kv[0]))}
    text = repr(value)
    return type(value).__qualname__ if re.search(r" at 0x[0-9a-fA-F]+", text) else text


def flag_name(field: str) -> str:
    return "--" + field.replace("_", "-")


@dataclasses.dataclass(frozen=True)
class Identity:
    """A job as its facts (plain JSON) and a short key of them."""

    facts: str  # canonical JSON
    key: str

    @property
    def as_dict(self) -> dict:
        return json.loads(self.facts)


def identity(config, cluster, task_class: str) -> Identity:
    """The job this process belongs to, from its TrainConfig, its Cluster and its task's class name.
    Every task of a job computes the same one: the cluster counts its training tasks and parameter
    servers, never an address (trainer.launch picks new ports every time) nor the role."""
    flags = {flag_name(field.name): _plain(getattr(config, field.name))
             for field in dataclasses.fields(config) if field.name not in OPERATIONAL_FIELDS}
    task_flags = vars(config.task_flags) if isinstance(config.task_flags, argparse.Namespace) else {}
    flags.update({flag_name(name): _plain(value) for name, value in task_flags.items()})
    facts = {
        "task": task_class,
        "cluster": {"training tasks": cluster.num_workers, "ps": cluster.num_ps},
        "trial": cluster.trial,
        "flags": dict(sorted(flags.items())),
    }
    text = json.dumps(facts, sort_keys=True, separators=(",", ":"))
    return Identity(text, hashlib.sha256(text.encode()).hexdigest()[:KEY_LENGTH])


def describe_cluster(cluster: Mapping[str, Any]) -> str:
    tasks, ps = cluster.get("training tasks", 0), cluster.get("ps", 0)
    text = f"{tasks} training task{'s' if tasks != 1 else ''}"
    return text + (f" + {ps} ps" if ps else "")


def differences(mine: Mapping[str, Any], theirs: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """(this job's side, the other's side) of each fact in which they differ, in the same order."""
    def flat(facts: Mapping[str, Any]) -> dict[str, str]:
        out = {"task": f"task {facts.get('task')}", "cluster": describe_cluster(facts.get("cluster") or {})}
        if facts.get("trial") is not None:
            out["trial"] = f"trial {facts['trial']}"
        for name, value in (facts.get("flags") or {}).items():
            out[name] = f"{name} {json.dumps(value) if not isinstance(value, str) else value}"
        return out

    a, b = flat(mine), flat(theirs)
    names = [name for name in [*a, *(n for n in b if n not in a)] if a.get(name) != b.get(name)]
    return ([a.get(n, f"no {n}") for n in names], [b.get(n, f"no {n}") for n in names])


def _named(items: list[str]) -> str:
    shown = items[:MAX_NAMED_DIFFERENCES]
    more = len(items) - len(shown)
    return ", ".join(shown) + (f" and {more} more" if more > 0 else "")


@dataclasses.dataclass(frozen=True)
class Record:
    """`job.json`: whose state the directory holds, and how far its run is."""

    key: str
    job: dict
    state: str = TRAINING
    run: str = ""  # a new id each time the job trains from scratch; kept over resumes
    launch: str = ""  # the launch token of the start that wrote it (LAUNCH_VARIABLES)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> "Record | None":
        """None for anything that is not a record this module wrote."""
        try:
            data = json.loads(text)
        except ValueError:
            return None
        if not isinstance(data, dict) or not isinstance(data.get("key"), str) or not isinstance(data.get("job"), dict):
            return None
        return cls(key=data["key"], job=data["job"], state=str(data.get("state", TRAINING)), run=str(data.get("run", "")),
                   launch=str(data.get("launch", "")))


def launch_token(environ: Mapping[str, str]) -> str:
    for variable in LAUNCH_VARIABLES:
        value = environ.get(variable, "").strip()
        if value:
            return f"{variable}={value}"
    return ""


def own_place(root: str, key: str) -> str:
    return outputs.join(root, OWN_PLACES, key)


@dataclasses.dataclass(frozen=True)
class Place:
    path: str
    note: str | None = None  # the line that says why it is not the checkpoint dir itself


def place(root: str, me: Identity, root_record: Record | None, root_has_state: bool, own_taken: bool) -> Place:
    """Where this job's state lives, from what the checkpoint dir holds: its record (None when it
    has none or an unreadable one), whether it holds a backup or epoch checkpoints, and whether
    this job already has its own place inside it. Every task of a job sees the same and decides
    the same: the one write a start makes, the chief's record of this same job, changes nothing
    here."""
    own = own_place(root, me.key)
    if own_taken:
        return Place(own)
    if root_record is None and not root_has_state:
        return Place(root)
    if root_record is not None and root_record.key == me.key:
        return Place(root)
    if root_record is None:
        return Place(own, f"checkpoints: {root} holds a backup or checkpoints that no job record names (written "
                          f"before records were kept, or by another program); this job keeps its own in {own}")
    mine, theirs = differences(me.as_dict, root_record.job)
    return Place(own, f"checkpoints: {root} holds the state of another job ({_named(theirs)}); this job "
                      f"({_named(mine)}) keeps its own in {own}")


def start(record: Record | None, me: Identity, has_backup: bool, token: str, new_run: Callable[[], str]) -> tuple[Record, bool]:
    """The chief's record for this start, and whether the epoch checkpoints an earlier run of this
    job left must go first (it trains from scratch: a finished run, or one stopped before its
    first backup). `record`: the place's, if any."""
    if record is not None and record.key == me.key and has_backup:
        return Record(me.key, me.as_dict, TRAINING, record.run or new_run(), token), False
    return Record(me.key, me.as_dict, TRAINING, new_run(), token), record is not None and record.key == me.key


def evaluator_may_start(record: Record | None, me: Identity, token: str) -> bool:
    """Whether the evaluator may evaluate what the place holds: the chief has recorded this job's
    run, training, or finished in this very launch (or no launch token can tell an earlier one)."""
    if record is None or record.key != me.key:
        return False
    if record.state == TRAINING:
        return True
    return not token or not record.launch or record.launch == token


# The edges: storage, through tf.io.gfile (local paths and gs:// alike).

def _read_record(directory: str) -> Record | None:
    import tensorflow as tf

    path = outputs.join(directory, RECORD)
    try:
        with tf.io.gfile.GFile(path) as handle:
            return Record.from_json(handle.read())
    except tf.errors.NotFoundError:
        return None


def _write_record(directory: str, record: Record) -> None:
    import tensorflow as tf

    tf.io.gfile.makedirs(directory)
    path = outputs.join(directory, RECORD)
    partial = f"{path}.{uuid.uuid4().hex[:8]}.partial"
    with tf.io.gfile.GFile(partial, "w") as handle:
        handle.write(record.to_json())
    tf.io.gfile.rename(partial, path, overwrite=True)


def _has_state(directory: str) -> bool:
    import tensorflow as tf

    return bool(tf.io.gfile.glob(outputs.join(directory, "epoch-*.index"))) or _has_backup(directory)


def _has_backup(directory: str) -> bool:
    import tensorflow as tf

    return tf.train.latest_checkpoint(outputs.backup_dir(directory)) is not None


def _remove_epoch_checkpoints(directory: str) -> int:
    import tensorflow as tf

    stale = tf.io.gfile.glob(outputs.join(directory, "epoch-*"))
    state_file = outputs.join(directory, "checkpoint")  # the epoch manager's list of them
    for path in [*stale, *([state_file] if tf.io.gfile.exists(state_file) else [])]:
        tf.io.gfile.remove(path)
    return len(stale)


def find_place(root: str, me: Identity) -> Place:
    import tensorflow as tf

    own_taken = tf.io.gfile.exists(outputs.join(own_place(root, me.key), RECORD))
    if own_taken:
        return Place(own_place(root, me.key))
    record = _read_record(root) if tf.io.gfile.isdir(root) else None
    return place(root, me, record, record is None and tf.io.gfile.isdir(root) and _has_state(root), False)


def settle(config, cluster, task_class: str, strategy_name: str, environ: Mapping[str, str]):
    """`config` with its checkpoint_dir moved to this job's place. The chief (a ParameterServer
    job's coordinator) records the start there; the evaluator waits for that record; a
    ParameterServer job's workers and parameter servers, which never touch state, skip it all."""
    from trainer import cluster as cluster_lib

    if strategy_name == "parameter_server" and cluster.task_type in (cluster_lib.WORKER, cluster_lib.PS):
        return config
    import tensorflow as tf

    me = identity(config, cluster, task_class)
    try:
        found = find_place(config.checkpoint_dir, me)
        if cluster.task_type == cluster_lib.EVALUATOR:
            _await_run(found.path, me, launch_token(environ), config.eval_timeout)
        elif cluster.is_chief:
            if found.note:
                log.info("%s", found.note)
            record, clear = start(_read_record(found.path) if tf.io.gfile.isdir(found.path) else None, me,
                                  _has_backup(found.path), launch_token(environ), lambda: uuid.uuid4().hex)
            if clear:
                removed = _remove_epoch_checkpoints(found.path)
                if removed:
                    log.info("checkpoints: an earlier run of this job left its epoch checkpoints in %s and no backup; "
                             "this run trains from scratch and replaces them", found.path)
            _write_record(found.path, record)
    except tf.errors.OpError as error:
        from trainer import exits
        from trainer.runtime import storage

        verdict = storage.failure(error)
        if verdict and verdict[0] == exits.RETRYABLE:
            raise
        message = (error.message or type(error).__name__).strip().splitlines()[0][:200]
        raise StateError(f"cannot keep the job's state in {config.checkpoint_dir}: {message}") from None
    return dataclasses.replace(config, checkpoint_dir=found.path)


def _await_run(directory: str, me: Identity, token: str, timeout: float, clock=time.monotonic, sleep=time.sleep) -> None:
    import tensorflow as tf

    deadline = clock() + timeout
    told = False
    while True:
        record = _read_record(directory) if tf.io.gfile.isdir(directory) else None
        if evaluator_may_start(record, me, token):
            return
        if clock() > deadline:
            # The line the evaluator gives when no checkpoint comes (trainer/runtime/roles/evaluator.py): from here, none came.
            raise StateError(f"evaluator: no new checkpoint in {directory} for {timeout:.0f}s (--eval-timeout); "
                             "last evaluated epoch: none")
        if not told:
            log.info("evaluator: waiting for this job's chief to record its run in %s", directory)
            told = True
        sleep(POLL_SECONDS)


def finish(config, cluster) -> None:
    """The chief's last word on a run that ended well: its record says finished."""
    from trainer import cluster as cluster_lib

    if not cluster.is_chief or cluster.task_type == cluster_lib.EVALUATOR:
        return
    record = _read_record(config.checkpoint_dir)
    if record is not None:
        _write_record(config.checkpoint_dir, dataclasses.replace(record, state=FINISHED))
