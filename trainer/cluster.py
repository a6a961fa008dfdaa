"""Who am I in the cluster? Resolves TF_CONFIG or CLUSTER_SPEC into one plain value.

Every platform describes the cluster slightly differently:

* Vertex AI sets TF_CONFIG with chief/worker/ps/evaluator, and CLUSTER_SPEC with
  workerpool0..workerpool3 (0 = chief, 1 = workers, 2 = parameter servers, 3 = evaluator).
  Pool 2 may instead hold Reduction Server reducers, which run Google's image and no TensorFlow
  server; both variables still name them `ps` / `workerpool2`, so the job's own spec (their
  `job` field) decides: when its pool 2 runs the reduction-server image, those tasks are reducers,
  counted in `num_reducers` and left out of the cluster TensorFlow is given.
* AI Platform Training (legacy) names the chief `master` (unless useChiefInTfConfig is set) and
  adds `task.trial` during hyperparameter tuning.
* A Kubeflow TFJob sets TF_CONFIG from its replica types (Chief, Master, Worker, PS, Evaluator).
* A JobSet (jobset.x-k8s.io) sets no cluster variable. The trainer builds the cluster from what
  Kubernetes gives every pod: the JobSet's name, the replicatedJob (the role) and the Job's index
  from the pod's JobSet labels through the downward API, the pod's index in its Indexed Job
  (JOB_COMPLETION_INDEX, set by the Job controller), the pod's hostname, and the pods of every role
  as a plain value (JOBSET_PODS). Each role is one Job whose pods are its completions, so pod i of
  role R is `{jobset}-{R}-0-{i}`, reachable as `{jobset}-{R}-0-{i}.{subdomain}` through the
  JobSet's headless Service (subdomain: JOBSET_SUBDOMAIN, else the JobSet's name).
  `JOBSET_VARIABLES` below is the one list of these variables; scripts/jobspec.py writes it into every
  JobSet it prints, and a JobSet written by hand copies it.
* A Kubeflow Trainer v2 TrainJob is such a JobSet, built by Trainer from a ClusterTrainingRuntime
  (manifests/runtimes/): its trainer nodes are the replicatedJob `node`, which is TensorFlow's
  `worker` here (`JOBSET_ROLE_NAMES`), and the runtime's env gives JOBSET_PODS the TrainJob's
  numNodes through TRAINJOB_NUM_NODES.

`resolve(environ)` turns any of these into a `Cluster`, including a normalized TF_CONFIG that
TensorFlow accepts: `master` becomes `chief` (MultiWorkerMirroredStrategy rejects `master`) and
the evaluator is left out of the training cluster. Nothing here imports TensorFlow or touches
os.environ, so it is cheap to call and to test.

`python -m trainer.cluster` prints the resolution as JSON, or one error line and exit code 2.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import socket
import sys
from typing import Any, Mapping

CHIEF, WORKER, PS, EVALUATOR = "chief", "worker", "ps", "evaluator"

# Every role name a platform may use, mapped to TensorFlow's name for it.
_ROLE_ALIASES = {
    "chief": CHIEF,
    "master": CHIEF,
    "worker": WORKER,
    "ps": PS,
    "evaluator": EVALUATOR,
    # Vertex AI CLUSTER_SPEC worker pools.
    "workerpool0": CHIEF,
    "workerpool1": WORKER,
    "workerpool2": PS,
    "workerpool3": EVALUATOR,
}
# Order of the jobs in the normalized cluster, so the JSON is stable.
_JOB_ORDER = (CHIEF, WORKER, PS)

# A JobSet pod's cluster variables; JOBSET_VARIABLES is the list a JobSet spec gives each container.
# The first three come through the downward API from the labels JobSet puts on every pod it
# creates (there before the container starts): variable -> label.
JOBSET_NAME, JOBSET_REPLICATED_JOB, JOBSET_JOB_INDEX = "JOBSET_NAME", "JOBSET_REPLICATED_JOB", "JOBSET_JOB_INDEX"
JOBSET_LABEL_ENV = {
    JOBSET_NAME: "jobset.sigs.k8s.io/jobset-name",
    JOBSET_REPLICATED_JOB: "jobset.sigs.k8s.io/replicatedjob-name",
    JOBSET_JOB_INDEX: "jobset.sigs.k8s.io/job-index",
}
# Plain values: the pods of every replicatedJob ("chief=1,worker=2,ps=1,evaluator=1"; no label
# holds a Job's pod count), and, only when they differ from the defaults, spec.network.subdomain
# (default: the JobSet's name) and the port every task listens on (default TF_PORT).
JOBSET_PODS, JOBSET_SUBDOMAIN, JOBSET_PORT = "JOBSET_PODS", "JOBSET_SUBDOMAIN", "JOBSET_PORT"
JOBSET_VARIABLES = (*JOBSET_LABEL_ENV, JOBSET_PODS, JOBSET_SUBDOMAIN, JOBSET_PORT)
# Set by the Kubernetes Job controller in every pod of an Indexed Job; a spec does not set it.
JOB_COMPLETION_INDEX = "JOB_COMPLETION_INDEX"
# replicatedJob names that are no TensorFlow role name, and the role they hold: `node`, the name
# Kubeflow Trainer gives the replicatedJob of a runtime's trainer nodes (constants.Node, v2.3.0
# pkg/constants/constants.go:69), whose pods are the workers of a TensorFlow cluster.
JOBSET_ROLE_NAMES = {"node": WORKER}
# The TrainJob's numNodes as the TensorFlow runtimes hand it to their pods (manifests/runtimes/):
# Trainer tells a plainML runtime's pods nothing of it, so the TrainJob gives it as env too.
TRAINJOB_NUM_NODES = "TRAINJOB_NUM_NODES"
TF_PORT = 2222

# Google's Reduction Server images, one per multi-region (Vertex AI "Distributed training" page,
# "Train using Reduction Server"); a tag or digest of the same image counts too.
REDUCTION_SERVER_IMAGES = (
    "us-docker.pkg.dev/vertex-ai-restricted/training/reductionserver:latest",
    "europe-docker.pkg.dev/vertex-ai-restricted/training/reductionserver:latest",
    "asia-docker.pkg.dev/vertex-ai-restricted/training/reductionserver:latest",
)
_REDUCTION_SERVER_IMAGE = re.compile(
    r"(us|europe|asia)-docker\.pkg\.dev/vertex-ai-restricted/training/reductionserver([:@][^\s/]+)?")


class ClusterConfigError(ValueError):
    """The cluster description in the environment cannot be used. str() is one line."""


@dataclasses.dataclass(frozen=True)
class Cluster:
    task_type: str
    task_index: int
    is_chief: bool
    trial: str | None
    num_workers: int  # chief plus workers: the replicas of a MultiWorkerMirrored job
    num_ps: int
    has_evaluator: bool
    tf_config: dict[str, Any] | None  # what this process gives TensorFlow; None: single process
    source: str  # "TF_CONFIG", "CLUSTER_SPEC", "JobSet" or "none"
    num_reducers: int = 0  # Vertex Reduction Server reducers (worker pool 2); never in tf_config

    @property
    def task_name(self) -> str:
        return f"{self.task_type}-{self.task_index}"

    @property
    def is_distributed(self) -> bool:
        return self.tf_config is not None

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)


def resolve(environ: Mapping[str, str]) -> Cluster:
    """Resolves the cluster from TF_CONFIG, else CLUSTER_SPEC, else a JobSet pod's variables (any
    JOBSET_* one present, even empty), else a single local process."""
    for variable in ("TF_CONFIG", "CLUSTER_SPEC"):
        raw = environ.get(variable, "").strip()
        if raw:
            return _resolve_json(variable, raw, environ.get("CLOUD_ML_TRIAL_ID"))
    # Presence, not a value, decides: a pod outside any JobSet that copies the JobSet env gets
    # empty labels, and must stop rather than train alone.
    if any(variable in environ for variable in JOBSET_VARIABLES):
        return _resolve_jobset(environ)
    return _single_process(environ.get("CLOUD_ML_TRIAL_ID"))


def environ_with_hostname(environ: Mapping[str, str]) -> dict[str, str]:
    """`environ` plus HOSTNAME from the kernel when it is missing. Container runtimes set HOSTNAME
    to the pod's hostname, which a JobSet pod's cluster is checked against."""
    return {"HOSTNAME": socket.gethostname(), **environ}


def _single_process(trial: str | None) -> Cluster:
    return Cluster(
        task_type=CHIEF,
        task_index=0,
        is_chief=True,
        trial=trial or None,
        num_workers=1,
        num_ps=0,
        has_evaluator=False,
        tf_config=None,
        source="none",
    )


def _resolve_json(variable: str, raw: str, trial_from_env: str | None) -> Cluster:
    try:
        spec = json.loads(raw)
    except json.JSONDecodeError as error:
        raise ClusterConfigError(f"{variable}: not valid JSON ({error.msg} at character {error.pos})") from None
    if not isinstance(spec, dict):
        raise ClusterConfigError(f"{variable}: expected a JSON object, got {type(spec).__name__}")
    return _resolve_spec(variable, spec, trial_from_env)


def _resolve_spec(variable: str, spec: dict, trial_from_env: str | None) -> Cluster:
    """A TF_CONFIG-shaped dict (from `variable`) -> Cluster; `variable` names it in errors and
    becomes the Cluster's source."""
    def fail(problem: str) -> ClusterConfigError:
        return ClusterConfigError(f"{variable}: {problem}")

    raw_cluster = spec.get("cluster") or {}
    task = spec.get("task")
    if not isinstance(raw_cluster, dict):
        raise fail('"cluster" must be an object of role -> list of "host:port"')
    if not raw_cluster and not task:
        # `TF_CONFIG='{}'` is a common way of saying "no cluster".
        return _single_process(trial_from_env)
    if not raw_cluster:
        raise fail('"cluster" is missing or empty')
    if not isinstance(task, dict):
        raise fail('"task" is missing: every process needs {"type": ..., "index": ...}')

    cluster: dict[str, list[str]] = {}
    for role, addresses in raw_cluster.items():
        canonical = _canonical_role(str(role), fail)
        if not isinstance(addresses, list) or not all(isinstance(a, str) for a in addresses):
            raise fail(f'cluster role "{role}" must be a list of "host:port" strings')
        if canonical in cluster and addresses:
            aliases = sorted(r for r in raw_cluster if _ROLE_ALIASES.get(str(r).lower()) == canonical)
            raise fail(f"cluster names the {canonical} twice ({' and '.join(aliases)}); keep one")
        if addresses:
            cluster[canonical] = list(addresses)

    task_type = _canonical_role(str(task.get("type", "")), fail)
    reducers: list[str] = []
    if runs_reduction_server(spec.get("job")):
        reducers = cluster.pop(PS, [])
        if task_type == PS:
            raise fail(f'task {task.get("type")} {task.get("index", 0)} is a Reduction Server reducer: the job\'s '
                       "worker pool 2 runs Google's reduction-server image (its spec, under \"job\"), not the trainer")
    task_index = task.get("index", 0)
    if isinstance(task_index, str) and task_index.isdigit():
        task_index = int(task_index)
    if not isinstance(task_index, int) or isinstance(task_index, bool) or task_index < 0:
        raise fail(f'task.index must be a non-negative integer, got {task_index!r}')
    if len(cluster.get(CHIEF, [])) > 1:
        raise fail(f"there must be at most one chief, the cluster lists {len(cluster[CHIEF])}")

    role_size = len(cluster.get(task_type, []))
    # An evaluator may be listed in the cluster (Vertex) or not (TensorFlow's convention).
    if task_type != EVALUATOR or role_size:
        if task_index >= role_size:
            raise fail(
                f"task {task_type} {task_index} is out of range: the cluster has "
                f"{role_size} {task_type} task(s)"
            )

    training_cluster = {job: cluster[job] for job in _JOB_ORDER if job in cluster}
    if not training_cluster.get(CHIEF) and not training_cluster.get(WORKER):
        raise fail("the cluster has neither a chief nor a worker")

    trial = task.get("trial")
    trial = str(trial) if trial not in (None, "") else (trial_from_env or None)
    if task_type != EVALUATOR and sum(len(hosts) for hosts in training_cluster.values()) == 1:
        # One training task: nothing to coordinate. Vertex gives even a single-replica job a
        # CLUSTER_SPEC (and no TF_CONFIG); it trains as one process, on all its local devices.
        return dataclasses.replace(_single_process(trial), has_evaluator=bool(cluster.get(EVALUATOR)), source=variable,
                                   num_reducers=len(reducers))
    # With a chief task, the chief leads. Without one, TensorFlow makes worker 0 the chief.
    if CHIEF in training_cluster:
        is_chief = task_type == CHIEF
    else:
        is_chief = task_type == WORKER and task_index == 0

    tf_config: dict[str, Any] = {
        "cluster": training_cluster,
        "task": {"type": task_type, "index": task_index},
    }
    if isinstance(spec.get("rpc_layer"), str):
        tf_config["rpc_layer"] = spec["rpc_layer"]
    return Cluster(
        task_type=task_type,
        task_index=task_index,
        is_chief=is_chief,
        trial=trial,
        num_workers=len(training_cluster.get(CHIEF, [])) + len(training_cluster.get(WORKER, [])),
        num_ps=len(training_cluster.get(PS, [])),
        has_evaluator=bool(cluster.get(EVALUATOR)) or task_type == EVALUATOR,
        tf_config=tf_config,
        source=variable,
        num_reducers=len(reducers),
    )


def runs_reduction_server(job: Any) -> bool:
    """Whether a Vertex job spec (CLUSTER_SPEC's or TF_CONFIG's `job`: the CustomJobSpec as a dict,
    camelCase or snake_case, or the same as a JSON string) runs Google's Reduction Server image in
    worker pool 2. Anything else, a missing or unreadable `job` included, is not: pool 2 then holds
    parameter servers, as it always did."""
    if isinstance(job, str):
        try:
            job = json.loads(job)
        except ValueError:
            return False
    if not isinstance(job, dict):
        return False
    pools = job.get("workerPoolSpecs", job.get("worker_pool_specs"))
    if not isinstance(pools, list) or len(pools) < 3 or not isinstance(pools[2], dict):
        return False
    container = pools[2].get("containerSpec", pools[2].get("container_spec"))
    image = container.get("imageUri", container.get("image_uri")) if isinstance(container, dict) else None
    return isinstance(image, str) and _REDUCTION_SERVER_IMAGE.fullmatch(image.strip()) is not None


def _resolve_jobset(environ: Mapping[str, str]) -> Cluster:
    """A JobSet pod's cluster, from JOBSET_VARIABLES, JOB_COMPLETION_INDEX and HOSTNAME. Every pod
    computes the same cluster from the same JOBSET_PODS; each finds itself in it by its own
    replicatedJob and completion index, and its hostname must be the one Kubernetes gives that pod,
    so a value read from the wrong place stops the pod instead of joining a wrong cluster."""
    def value(variable: str, hint: str) -> str:
        text = environ.get(variable, "").strip()
        if not text:
            state = "empty" if variable in environ else "not set"
            raise ClusterConfigError(f"{variable} is {state} in this JobSet pod: {hint}")
        return text

    def from_label(variable: str) -> str:
        label = JOBSET_LABEL_ENV[variable]
        return value(variable, f"env valueFrom.fieldRef.fieldPath: metadata.labels['{label}'] gives it "
                               "(empty: the pod has no such label, so it is not running in a JobSet)")

    jobset = from_label(JOBSET_NAME)
    replicated_job = from_label(JOBSET_REPLICATED_JOB)
    job_index_text = from_label(JOBSET_JOB_INDEX)
    pods_text = value(JOBSET_PODS, "a plain value with the pods of every replicatedJob, e.g. chief=1,worker=2,ps=1")
    completion_text = value(JOB_COMPLETION_INDEX, "Kubernetes sets it in every pod of an Indexed Job "
                                                  "(the replicatedJob's template needs completionMode: Indexed)")
    hostname = value("HOSTNAME", "the container runtime sets it to the pod's hostname")

    pods = _jobset_pods(pods_text)
    role = _jobset_role(replicated_job, JOBSET_REPLICATED_JOB)
    if replicated_job not in pods:
        raise ClusterConfigError(f'{JOBSET_REPLICATED_JOB} is "{replicated_job}", which {JOBSET_PODS} '
                                 f'("{pods_text}") does not list: give every replicatedJob its pods there')
    if not job_index_text.isdigit():
        raise ClusterConfigError(f'{JOBSET_JOB_INDEX} is "{job_index_text}", not a Job index')
    if int(job_index_text) != 0:
        raise ClusterConfigError(
            f"{JOBSET_JOB_INDEX} is {job_index_text}: the trainer takes one Job per role (replicas: 1), whose pods "
            f"are the role's tasks (completionMode: Indexed, completions = parallelism = the role's pods)")
    if not completion_text.isdigit():
        raise ClusterConfigError(f'{JOB_COMPLETION_INDEX} is "{completion_text}", not a pod index')
    task_index = int(completion_text)
    if task_index >= pods[replicated_job]:
        hint = "it must list each Job's completions"
        if TRAINJOB_NUM_NODES in environ:
            hint = (f"a TrainJob's numNodes must reach its pods as env {TRAINJOB_NUM_NODES} too "
                    f"(here {environ[TRAINJOB_NUM_NODES]!r}), which the runtime's {JOBSET_PODS} reads")
        raise ClusterConfigError(
            f"{JOB_COMPLETION_INDEX} is {task_index}, but {JOBSET_PODS} gives {replicated_job} {pods[replicated_job]} "
            f"pod(s) (indices 0..{pods[replicated_job] - 1}): {hint}")
    expected_hostname = f"{jobset}-{replicated_job}-{job_index_text}-{task_index}"
    if hostname != expected_hostname:
        raise ClusterConfigError(
            f'HOSTNAME is "{hostname}", but Kubernetes names pod {task_index} of Job {jobset}-{replicated_job}-'
            f'{job_index_text} "{expected_hostname}": {JOBSET_NAME}, {JOBSET_REPLICATED_JOB} and {JOBSET_JOB_INDEX} '
            f"must come from this pod's own labels")

    subdomain = environ.get(JOBSET_SUBDOMAIN, "").strip() or jobset
    port_text = environ.get(JOBSET_PORT, "").strip() or str(TF_PORT)
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ClusterConfigError(f'{JOBSET_PORT} is "{port_text}", not a port number')
    cluster = jobset_cluster(jobset, pods, subdomain, port_text)
    if len(cluster.get(CHIEF, [])) > 1:
        raise ClusterConfigError(f'{JOBSET_PODS} ("{pods_text}") gives the chief {len(cluster[CHIEF])} pods; '
                                 "a cluster has one chief (more tasks go to workers)")
    if not cluster.get(CHIEF) and not cluster.get(WORKER):
        raise ClusterConfigError(f'{JOBSET_PODS} ("{pods_text}") has neither a chief nor a worker')
    return _resolve_spec("JobSet", {"cluster": cluster, "task": {"type": role, "index": task_index}},
                         environ.get("CLOUD_ML_TRIAL_ID"))


def jobset_cluster(jobset: str, pods: Mapping[str, int], subdomain: str = "", port: int | str = TF_PORT) -> dict[str, list[str]]:
    """Role -> the `host:port` of each of its tasks, for JobSet `jobset` whose replicatedJob R is one
    Job of pods[R] pods: pod i of R is `{jobset}-{R}-0-{i}` under the headless Service `subdomain`
    (the JobSet's name when empty). The evaluator, when there is one, is listed like any role."""
    subdomain = subdomain or jobset
    return {_jobset_role(name, JOBSET_PODS): [f"{jobset}-{name}-0-{i}.{subdomain}:{port}" for i in range(count)]
            for name, count in pods.items()}


def _jobset_pods(text: str) -> dict[str, int]:
    """JOBSET_PODS "chief=1,worker=2" -> {replicatedJob name: pods}, in the order given."""
    pods: dict[str, int] = {}
    roles: dict[str, str] = {}  # role -> the replicatedJob that holds it, to catch chief and master both
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        name, equals, count = (piece.strip() for piece in item.partition("="))
        if not equals or not count.isdigit() or int(count) < 1:
            raise ClusterConfigError(f'{JOBSET_PODS}: "{item}" is not REPLICATEDJOB=PODS with PODS at least 1 '
                                     "(e.g. chief=1,worker=2,ps=1)")
        role = _jobset_role(name, JOBSET_PODS)
        if name in pods or role in roles:
            twice = name if name in pods else f"{roles[role]} and {name}"
            raise ClusterConfigError(f"{JOBSET_PODS} names the {role} twice ({twice}); keep one")
        pods[name] = int(count)
        roles[role] = name
    if not pods:
        raise ClusterConfigError(f'{JOBSET_PODS} ("{text}") lists no replicatedJob')
    return pods


def _jobset_role(replicated_job: str, variable: str) -> str:
    role = JOBSET_ROLE_NAMES.get(replicated_job.lower()) or _ROLE_ALIASES.get(replicated_job.lower())
    if role is None or replicated_job.lower().startswith("workerpool"):
        raise ClusterConfigError(f'{variable}: replicatedJob "{replicated_job}" is not a role: name each '
                                 "replicatedJob chief (or master), worker (or node, Kubeflow Trainer's), ps or evaluator")
    return role


def _canonical_role(role: str, fail) -> str:
    canonical = _ROLE_ALIASES.get(role.strip().lower())
    if canonical is None:
        known = "chief, master, worker, ps, evaluator, workerpool0..workerpool3"
        raise fail(f'unknown task type "{role}" (known: {known})')
    return canonical


def main() -> int:
    try:
        cluster = resolve(environ_with_hostname(os.environ))
    except ClusterConfigError as error:
        print(f"trainer.cluster: {error}", file=sys.stderr)
        return 2
    print(cluster.to_json())
    return 0


if __name__ == "__main__":
    sys.exit(main())
