"""JobSet (jobset.x-k8s.io/v1alpha2): the manifest. A JobSet sets no cluster variable: each pod's
whole environment, from which trainer.cluster finds the cluster itself, is what the manifest
writes (jobset_container_env), and scripts/rehearsal/jobset/ plays it."""

from __future__ import annotations

import json
import re

from scripts.jobspec.request import JobRequest, Pool, SpecError, vertex_only
from trainer import cluster as trainer_cluster  # imports no TensorFlow

JOBSET_API_VERSION = "jobset.x-k8s.io/v1alpha2"
# The exit codes a pod may be retried after, the ones Kubeflow's `restartPolicy: ExitCode` retries
# (training-operator's IsRetryableExitCode): 143 is trainer.exits.RETRYABLE (a lost cluster, a
# preemption), 130/137/138 are signals (137: out of memory, or SIGKILL after the grace period).
# A pod that is replaced alone (a PSS worker, the evaluator) reaches no peer's collective, so any
# other code of its own (2: configuration or bad input; 1: a bug) fails the JobSet at once.
RETRYABLE_EXIT_CODES = (130, 137, 138, 143)
# A task of a collective (an MWMS task, the PSS coordinator or a parameter server) also fails with
# 1 when a peer is lost: a plain script's uncaught UnavailableError, milliseconds after a preempted
# peer's SIGKILL, while that peer's pod is not yet Failed (or much later, when its node is gone). So
# for those only the codes no lost peer can give fail the JobSet at once: bad input (2, and a
# command that cannot be run: 126, 127, as a shell says). Any other code restarts the JobSet, at
# most maxRestarts times, however the failures of one attempt are ordered.
PERMANENT_EXIT_CODES = (2, 126, 127)
GKE_SPOT_LABEL = "cloud.google.com/gke-spot"
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
# A DNS-1035 label: what Kubernetes requires of the Service (the subdomain) and the pods' hostnames.
_DNS_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")


def jobset_header(manifest: dict) -> str:
    """The comment printed above a JobSet: what it is and what the cluster needs to run it."""
    queue = manifest["metadata"].get("labels", {}).get(KUEUE_QUEUE_LABEL)
    needs = "the JobSet controller (v0.7 or later)"
    if queue:
        needs += f" and Kueue, with a LocalQueue {queue} in namespace {manifest['metadata'].get('namespace', 'default')}"
    return (f"# A JobSet ({JOBSET_API_VERSION}): one Indexed Job per role; each pod gets its cluster as TF_CONFIG, and\n"
            f"# as its JobSet labels and JOBSET_PODS (trainer/cluster.py). Needs {needs}.\n"
            f"# Apply with: kubectl apply -f FILE\n")


def jobset_manifest(request: JobRequest, namespace: str, queue: str | None = None) -> dict:
    """A JobSet: one replicatedJob per role (chief, worker, ps, evaluator), each a single Job
    (replicas: 1) whose pods are the role's tasks (Indexed, completions = parallelism = pods), so
    pod i of role R has the hostname `{name}-{R}-0-{i}` and the DNS name `{name}-{R}-0-{i}.{name}`.
    Every container gets trainer.cluster's JobSet variables and a TF_CONFIG that says the same
    (jobset_container_env)."""
    vertex_only(request, "a JobSet")
    name = request.name.lower().replace("_", "-")
    _check_jobset_names(name, request.pools)
    pods = {pool.role: pool.replicas for pool in request.pools}
    # The JobSet succeeds when the chief does; JobSet then deletes the Jobs still running (parameter
    # servers and PSS workers serve until stopped). The evaluator is waited for as well: it
    # evaluates the last checkpoint after the chief has finished, then exits by itself.
    succeeds_with = ["chief"] + (["evaluator"] if request.pool("evaluator") else [])
    # A Job fails for a permanent exit code through its podFailurePolicy (reason PodFailurePolicy):
    # that fails the JobSet, also when another Job failed first in the same attempt (JobSet tries
    # its rules in order over every failed Job). Any other Job failure restarts the whole JobSet
    # (the default action), at most maxRestarts times. BlockingRecreate starts no new pod until every old one is gone, so
    # a new task never reaches a task of the previous attempt under the same DNS name, and every
    # old task has written its SIGTERM backup before the new ones read it.
    rules = [{"name": "permanentExitCode", "action": "FailJobSet", "onJobFailureReasons": ["PodFailurePolicy"]}]
    if request.timeout_seconds:
        rules.append({"name": "timeLimit", "action": "FailJobSet", "onJobFailureReasons": ["DeadlineExceeded"]})
    metadata: dict = {"name": name, "namespace": namespace}
    labels = dict(request.labels)
    if queue:
        # A LocalQueue is a Kubernetes object named as a DNS label, and the name is a label value:
        # anything else the API server refuses only when the JobSet is applied.
        if not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", queue) or len(queue) > 63:
            raise SpecError(f"--queue {queue!r}: a LocalQueue name is lower-case letters, digits and '-', "
                            "at most 63, starting and ending with a letter or digit")
        # Kueue's webhook suspends the JobSet on creation and resumes it when the queue admits it.
        labels[KUEUE_QUEUE_LABEL] = queue
    if labels:
        metadata["labels"] = labels
    return {
        "apiVersion": JOBSET_API_VERSION,
        "kind": "JobSet",
        "metadata": metadata,
        "spec": {
            # The webhook defaults both to true; written out because the cluster depends on them:
            # pods are reached by DNS name, and before they are Ready (TensorFlow connects at start).
            "network": {"enableDNSHostnames": True, "publishNotReadyAddresses": True},
            "successPolicy": {"operator": "All", "targetReplicatedJobs": succeeds_with},
            "failurePolicy": {"maxRestarts": request.max_restarts, "restartStrategy": "BlockingRecreate", "rules": rules},
            "replicatedJobs": [{"name": pool.role, "replicas": 1, "template": _jobset_job(request, name, pool, pods)}
                               for pool in request.pools],
        },
    }


# The annotation the Job controller gives each pod of an Indexed Job its index in
# (batch.kubernetes.io/job-completion-index), and reads JOB_COMPLETION_INDEX from.
COMPLETION_INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"


def jobset_container_env(jobset: str, pods: dict[str, int], role: str) -> list[dict]:
    """A container's env in the JobSet `jobset` whose replicatedJob R has pods[R] pods, for a pod of
    `role`: trainer.cluster's JobSet variables (the labels through the downward API, the pods of
    every role as a plain value), then TF_CONFIG, for a command that reads nothing else.

    TF_CONFIG's cluster is the one trainer.cluster computes from those variables (jobset_cluster),
    the evaluator left out of it as TensorFlow expects; its task index is the pod's completion
    index, through `$(JOB_COMPLETION_INDEX)`. Kubernetes expands a `$(VAR)` only to a variable
    defined earlier in the list, and the Job controller appends its JOB_COMPLETION_INDEX last
    (addCompletionIndexEnvVariable, pkg/controller/job), so it is defined here first, from the same
    annotation; the controller then leaves a container that has one alone."""
    env: list[dict] = [{"name": variable, "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{label}']"}}}
                       for variable, label in trainer_cluster.JOBSET_LABEL_ENV.items()]
    env.append({"name": trainer_cluster.JOBSET_PODS, "value": ",".join(f"{name}={count}" for name, count in pods.items())})
    env.append({"name": trainer_cluster.JOB_COMPLETION_INDEX,
                "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{COMPLETION_INDEX_ANNOTATION}']"}}})
    hosts = trainer_cluster.jobset_cluster(jobset, pods)
    training = {name: addresses for name, addresses in hosts.items() if name != trainer_cluster.EVALUATOR}
    # The index is a JSON number once Kubernetes has put the pod's index in place of the reference.
    index = "$(" + trainer_cluster.JOB_COMPLETION_INDEX + ")"
    tf_config = json.dumps({"cluster": training, "task": {"type": role, "index": 0}}).replace('"index": 0}', f'"index": {index}}}')
    env.append({"name": "TF_CONFIG", "value": tf_config})
    return env


def _jobset_job(request: JobRequest, jobset: str, pool: Pool, pods: dict[str, int]) -> dict:
    """The Job template of one role."""
    args = list(request.trainer_args)
    env = jobset_container_env(jobset, pods, pool.role)
    if request.base_output_dir:
        # As Vertex names them under baseOutputDirectory: trainer.outputs reads them when no flag
        # is given, and so can any script.
        base = request.base_output_dir.rstrip("/")
        env += [{"name": "AIP_MODEL_DIR", "value": f"{base}/model/"},
                {"name": "AIP_CHECKPOINT_DIR", "value": f"{base}/checkpoints/"},
                {"name": "AIP_TENSORBOARD_LOG_DIR", "value": f"{base}/logs/"}]
        if args and "--model-dir" not in args:
            args += ["--model-dir", f"{base}/model"]
    container: dict = {"name": "trainer", "image": pool.image_uri}
    if args:
        # Without trainer arguments, no args: the image's own ENTRYPOINT and CMD run, whatever they are.
        container["args"] = args
    container.update({"ports": [{"name": "tf", "containerPort": trainer_cluster.TF_PORT, "protocol": "TCP"}],
                      "env": env})
    if pool.accelerator_type:
        container["resources"] = {"limits": {"nvidia.com/gpu": pool.accelerator_count}}
    # restartPolicy Never: a failed pod is replaced by a new one with the same index, and so the same
    # hostname, and podFailurePolicy (which needs Never) can judge its exit code.
    pod_spec: dict = {"restartPolicy": "Never", "containers": [container]}
    if request.service_account:
        pod_spec["serviceAccountName"] = request.service_account
    if request.spot:
        pod_spec["nodeSelector"] = {GKE_SPOT_LABEL: "true"}
        pod_spec["tolerations"] = [{"key": GKE_SPOT_LABEL, "operator": "Equal", "value": "true", "effect": "NoSchedule"}]
    # A PSS worker or the evaluator can be replaced alone: the coordinator moves a lost worker's
    # functions to the others and takes the new one back under the same DNS name, and the evaluator
    # only reads checkpoints. Their pods are replaced up to max-restarts times, and a pod stopped by
    # a preemption, an eviction or a drain (condition DisruptionTarget) is not counted. Any other
    # task cannot rejoin alone (an MWMS collective, the coordinator, a parameter server's variables),
    # so its first failure fails its Job and the JobSet restarts whole; a disruption counts as
    # that failure rather than ever being taken for a permanent exit code, and so does the exit 1
    # of a peer that lost it (PERMANENT_EXIT_CODES).
    alone = pool.role == "evaluator" or (request.strategy == "pss" and pool.role == "worker")
    job_spec: dict = {
        "completionMode": "Indexed",
        "completions": pool.replicas,
        "parallelism": pool.replicas,
        "backoffLimit": request.max_restarts if alone else 0,
        "podFailurePolicy": {"rules": [
            {"action": "Ignore" if alone else "Count",
             "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
            {"action": "FailJob", "onExitCodes": {"operator": "NotIn", "values": list(RETRYABLE_EXIT_CODES)}
             if alone else {"operator": "In", "values": list(PERMANENT_EXIT_CODES)}},
        ]},
        "template": {"spec": pod_spec},
    }
    if request.timeout_seconds:
        # JobSet v1alpha2 has no JobSet-wide time limit, so each Job has one; it counts from the
        # Job's start, and so starts over when the JobSet restarts (the failure rule "timeLimit"
        # makes the first expiry final).
        job_spec["activeDeadlineSeconds"] = request.timeout_seconds
    return {"spec": job_spec}


def _check_jobset_names(name: str, pools) -> None:
    """JobSet's webhook rejects a JobSet whose name is not a DNS label or whose longest pod name,
    `{name}-{role}-0-{index}-` plus 5 random characters, passes 63 characters."""
    if not _DNS_LABEL.fullmatch(name):
        raise SpecError(f"--name {name}: a JobSet name must start with a letter and hold only lowercase letters, "
                        "digits and '-' (it becomes the pods' DNS subdomain)")
    longest = max((f"{name}-{pool.role}-0-{pool.replicas - 1}-abcde" for pool in pools), key=len)
    if len(longest) > 63:
        raise SpecError(f"--name {name}: too long for a JobSet, pod names such as {longest[:-5]}xxxxx would pass "
                        f"63 characters; use at most {63 - (len(longest) - len(name))}")
