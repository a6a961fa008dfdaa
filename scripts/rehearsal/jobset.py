"""JobSet's rules over the runner: a JobSet's pods as Kubernetes and the JobSet controller run them.

Read from kubernetes-sigs/jobset v0.12.0 (pkg/webhooks/jobset_webhook.go, pkg/controllers/) and
Kubernetes' Job controller (pkg/controller/job: job_controller.go, pod_failure_policy.go); each
rule below names the function it follows.

Before anything runs, `admitted` applies what the API server would: the JobSet webhook's defaults
(Default) and what the webhook and Kubernetes' Job validation refuse, refused here with one line.

Each pod (`jobset_pods`) gets what the cluster gives it: the hostname `{job}-{index}` of its
Indexed Job `{jobset}-{replicatedJob}-{jobIndex}`, a name with 5 random characters after it, the
JobSet's labels and annotations (restart-attempt is the JobSet's restart count, so a new attempt's
pods read the new value), and each container's environment with the downward API resolved and
JOB_COMPLETION_INDEX set. Other pods reach it only as `{hostname}.{subdomain}` (and its
`.{namespace}.svc[.cluster.local]` forms): JobSet's headless Service gives no bare name.

The rules over the pods' exits:
- restartPolicy Never: a failed pod goes through its Job's podFailurePolicy, first matching rule
  (pod_failure_policy.go): FailJob fails the Job (reason PodFailurePolicy, with Kubernetes'
  message), Ignore replaces the pod uncounted, Count (and no rule) replaces it until more than
  backoffLimit pods failed, then the Job fails (BackoffLimitExceeded). A pod that `--preempt`
  evicts has the DisruptionTarget condition;
- restartPolicy OnFailure: the kubelet restarts the container in place, after its crash-loop
  back-off (10 s, doubling), and the Job fails once its containers' restarts reach backoffLimit
  (pastBackoffLimitOnFailure);
- activeDeadlineSeconds: a Job active longer fails (DeadlineExceeded), its pods stopped;
- a failed Job goes through the JobSet's failurePolicy (failure_policy.go): no policy fails the
  JobSet; the first rule whose onJobFailureReasons, onJobFailureMessagePatterns and
  targetReplicatedJobs all match decides, else RestartJobSet. RestartJobSet recreates every Job
  while fewer than maxRestarts restarts counted towards it, else fails the JobSet;
  RestartJobSetAndIgnoreMaxRestarts recreates them uncounted. Recreate starts the new pods while
  the old ones take their grace; BlockingRecreate waits until every old pod is gone;
- a replicatedJob with dependsOn starts once each dependency is Ready (every Job ready: each pod
  running or done) or Complete (depends_on.go); startupPolicy InOrder waits on the one before;
- the JobSet succeeds by its successPolicy (success_policy.go), and the pods still running stop.

Stopping a pod is SIGTERM, then SIGKILL after its terminationGracePeriodSeconds (default 30).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
import re
import time
import uuid
from typing import Callable

from scripts.rehearsal import fields
from scripts.rehearsal.storage import BUCKET_NAME
from scripts.rehearsal.runner import (Container, Fault, Outcome, Output, PREFIX, RehearsalError, Restart, Run, Session,
                                      drive, parse_fault)
from trainer import cluster as trainer_cluster

API_VERSION = "jobset.x-k8s.io/v1alpha2"
DEFAULT_BACKOFF_LIMIT = 6  # Kubernetes' default for a Job
DEFAULT_GRACE_SECONDS = 30  # a pod's default terminationGracePeriodSeconds
DEADLINE_EXIT = 124  # the rehearsal's exit code when a Job's activeDeadlineSeconds ended the JobSet
# The kubelet's crash-loop back-off before it restarts a container in place: 10 s, doubling, at most 5 min.
CRASH_LOOP_FIRST_SECONDS, CRASH_LOOP_MAX_SECONDS = 10, 300
EVICTION = "eviction"
POD_NAME = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
GCS_FUSE_DRIVER = "gcsfuse.csi.storage.gke.io"  # GKE's Cloud Storage FUSE CSI driver
# The reasons a failed Job's condition can give (validOnJobFailureReasons, jobset_webhook.go).
JOB_FAILURE_REASONS = ("BackoffLimitExceeded", "DeadlineExceeded", "FailedIndexes", "MaxFailedIndexesExceeded",
                       "PodFailurePolicy")
# The Job conditions' messages, as Kubernetes' Job controller writes them (job_controller.go,
# pod_failure_policy.go): what onJobFailureMessagePatterns is matched against.
BACKOFF_MESSAGE = "Job has reached the specified backoff limit"
DEADLINE_MESSAGE = "Job was active longer than specified deadline"
# generateName's random suffix alphabet (k8s.io/apiserver names.go: no vowels, no look-alikes).
_SUFFIX_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"

# What the rehearsal emulates of a JobSet (fields.py); everything else is named once, at the start.
_POD_SPEC = {"restartPolicy": fields.ALL, "terminationGracePeriodSeconds": fields.ALL, "volumes": fields.ALL,
             "serviceAccountName": fields.ALL,
             "containers": [{"name": fields.ALL, "image": fields.ALL, "command": fields.ALL, "args": fields.ALL,
                             "env": fields.ALL, "ports": fields.ALL, "volumeMounts": fields.ALL,
                             "resources": {"limits": {"nvidia.com/gpu": fields.ALL}}}]}
EMULATED = {
    "apiVersion": fields.ALL, "kind": fields.ALL,
    "metadata": {"name": fields.ALL, "namespace": fields.ALL},
    "spec": {
        "network": fields.ALL, "successPolicy": fields.ALL, "failurePolicy": fields.ALL, "coordinator": fields.ALL,
        "startupPolicy": fields.ALL,
        "replicatedJobs": [{
            "name": fields.ALL, "replicas": fields.ALL, "groupName": fields.ALL, "dependsOn": fields.ALL,
            "template": {"metadata": fields.ALL, "spec": {
                "completionMode": fields.ALL, "completions": fields.ALL, "parallelism": fields.ALL,
                "backoffLimit": fields.ALL, "podFailurePolicy": fields.ALL, "activeDeadlineSeconds": fields.ALL,
                "template": {"metadata": {"labels": fields.ALL, "annotations": fields.ALL}, "spec": _POD_SPEC}}}}],
    },
}


def load(path: str) -> dict:
    """A JobSet manifest from YAML or JSON ('-' for stdin); the first JobSet in a multi-document file."""
    import sys

    import yaml

    try:
        text = sys.stdin.read() if path == "-" else open(path).read()
        documents = [doc for doc in yaml.safe_load_all(text) if doc]
    except (OSError, yaml.YAMLError) as error:
        raise RehearsalError(f"{path}: {str(error).splitlines()[0]}") from None
    jobsets = [doc for doc in documents if isinstance(doc, dict) and doc.get("kind") == "JobSet"]
    if not jobsets:
        raise RehearsalError(f"{path}: no JobSet in it (kind: JobSet)")
    if str(jobsets[0].get("apiVersion", "")) != API_VERSION:
        raise RehearsalError(f"{path}: apiVersion {jobsets[0].get('apiVersion')!r}; the rehearsal reads {API_VERSION}")
    return jobsets[0]


# --- What the API server makes of a manifest -----------------------------------------------------

def admitted(manifest: dict) -> dict:
    """The manifest as the API server would store it: the JobSet webhook's defaults (Default in
    jobset_webhook.go), then what the webhook (ValidateCreate, validateFailurePolicy) and
    Kubernetes' Job validation refuse, refused here with one line each. A new dict."""
    manifest = json.loads(json.dumps(manifest))
    spec = manifest.setdefault("spec", {})
    spec.setdefault("successPolicy", {"operator": "All"})
    spec.setdefault("startupPolicy", {"startupPolicyOrder": "AnyOrder"})
    network = spec.setdefault("network", {})
    network.setdefault("enableDNSHostnames", True)
    network.setdefault("publishNotReadyAddresses", True)
    rjobs = spec.get("replicatedJobs") or []
    if not rjobs:
        raise RehearsalError("spec.replicatedJobs is empty: a JobSet needs at least one replicatedJob")
    for rjob in rjobs:
        rjob.setdefault("replicas", 1)
        job_spec = rjob["template"].setdefault("spec", {})
        job_spec.setdefault("completionMode", "Indexed")
        # "Default pod restart policy to OnFailure" (Default): a template that names none gets it.
        job_spec["template"]["spec"].setdefault("restartPolicy", "OnFailure")
    policy = spec.get("failurePolicy")
    if policy is not None:
        for index, rule in enumerate(policy.get("rules") or []):
            rule.setdefault("name", f"failurePolicyRule{index}")
    _validate(manifest)
    return manifest


def _validate(manifest: dict) -> None:
    spec = manifest["spec"]
    rjobs = spec["replicatedJobs"]
    names = [rjob["name"] for rjob in rjobs]
    if rjobs[0].get("dependsOn"):
        raise RehearsalError(f"replicatedJob {names[0]}: dependsOn can't be set for the first ReplicatedJob "
                             "(JobSet's webhook refuses it)")
    for position, rjob in enumerate(rjobs):
        where = f"replicatedJob {rjob['name']}"
        for dependency in rjob.get("dependsOn") or []:
            if dependency.get("name") not in names[:position]:
                raise RehearsalError(f"{where}: cannot depend on replicatedJob {dependency.get('name')!r}: only on one "
                                     "listed before it (JobSet's webhook refuses it)")
            if dependency.get("status") not in ("Ready", "Complete"):
                raise RehearsalError(f"{where}: dependsOn status {dependency.get('status')!r} is not Ready or Complete")
        job_spec = rjob["template"]["spec"]
        restart_policy = job_spec["template"]["spec"]["restartPolicy"]
        if restart_policy not in ("Never", "OnFailure"):
            raise RehearsalError(f"{where}: restartPolicy {restart_policy}: a Job's pods take Never or OnFailure "
                                 "(Kubernetes refuses the Job)")
        if job_spec.get("podFailurePolicy") and restart_policy != "Never":
            given = "defaulted to OnFailure by JobSet's webhook, as none is set" if restart_policy == "OnFailure" else ""
            raise RehearsalError(f"{where}: podFailurePolicy needs the pod template's restartPolicy Never; it is "
                                 f"{restart_policy}{' (' + given + ')' if given else ''}, and Kubernetes refuses the Job")
        for rule in (job_spec.get("podFailurePolicy") or {}).get("rules", []):
            if rule.get("action") not in ("FailJob", "Ignore", "Count"):
                raise RehearsalError(f"{where}: podFailurePolicy action {rule.get('action')} (backoffLimitPerIndex) "
                                     "is not emulated")
    policy = spec.get("failurePolicy") or {}
    strategy = policy.get("restartStrategy", "Recreate")
    if strategy not in ("Recreate", "BlockingRecreate"):
        raise RehearsalError(f"failurePolicy.restartStrategy {strategy}: JobSet's webhook refuses it while its feature "
                             "gate (InPlaceRestart) is off, as it is by default in v0.12")
    for rule in policy.get("rules") or []:
        if rule.get("action") in ("RestartJob", "RestartJobAndIgnoreMaxRestarts"):
            raise RehearsalError(f"failurePolicy rule {rule['name']}: action {rule['action']}: JobSet's webhook refuses "
                                 "it while the RestartJob feature gate is off, as it is by default in v0.12")
        if rule.get("action") not in ("FailJobSet", "RestartJobSet", "RestartJobSetAndIgnoreMaxRestarts"):
            raise RehearsalError(f"failurePolicy rule {rule['name']}: unknown action {rule.get('action')!r}")
        for reason in rule.get("onJobFailureReasons") or []:
            if reason not in JOB_FAILURE_REASONS:
                raise RehearsalError(f"failurePolicy rule {rule['name']}: {reason!r} is not a Job failure reason "
                                     f"({', '.join(JOB_FAILURE_REASONS)})")
        for target in rule.get("targetReplicatedJobs") or []:
            if target not in names:
                raise RehearsalError(f"failurePolicy rule {rule['name']}: targetReplicatedJobs names {target!r}, "
                                     "which is not a replicatedJob")
    for target in spec["successPolicy"].get("targetReplicatedJobs") or []:
        if target not in names:
            raise RehearsalError(f"successPolicy.targetReplicatedJobs names {target!r}, which is not a replicatedJob")


# --- Every pod, as Kubernetes creates it --------------------------------------------------------

def stable_suffix(hostname: str) -> str:
    """Five characters of generateName's alphabet, the same for the same hostname (for specs read
    without running them); a running rehearsal draws them at random for each new pod."""
    digest = hashlib.sha1(hostname.encode()).digest()
    return "".join(_SUFFIX_ALPHABET[b % len(_SUFFIX_ALPHABET)] for b in digest[:5])


def random_suffix(_hostname: str) -> str:
    return "".join(random.choice(_SUFFIX_ALPHABET) for _ in range(5))


def jobset_pods(manifest: dict, restart_attempt: int = 0, suffix: Callable[[str], str] = stable_suffix) -> list[dict]:
    """Every pod of a JobSet manifest as Kubernetes would create it, from the manifest alone
    (generated or written by hand): JobSet's Jobs `{jobset}-{replicatedJob}-{jobIndex}` and the
    labels and annotations it puts on their pods (constructJob, labelAndAnnotateObject), the
    Indexed Job controller's hostname, completion index and JOB_COMPLETION_INDEX, and each
    container's environment with every downward-API fieldRef resolved against those labels,
    `$(VAR)` expanded, and HOSTNAME as the runtime sets it.
    Each pod: {name, hostname, subdomain, namespace, replicated_job, job, job_index,
    completion_index, labels, annotations, containers: [{name, image, command, args, ports, env}],
    env (the first container's)}. `name` is the hostname and a 5-character suffix (`suffix`).
    The webhook's create-time defaults apply. Raises RehearsalError for what Kubernetes would
    refuse or leave unknowable before a pod runs."""
    manifest = admitted(manifest)
    pods = []
    for identity in pod_identities(manifest, restart_attempt):
        pods.append(resolve_pod(identity, manifest, f"{identity['hostname']}-{suffix(identity['hostname'])}"))
    return pods


def pod_identities(manifest: dict, restart_attempt: int = 0) -> list[dict]:
    """Every pod's identity (hostname, subdomain, Job, labels, annotations), without containers."""
    metadata, spec = manifest["metadata"], manifest["spec"]
    jobset, namespace = metadata["name"], metadata.get("namespace", "default")
    network = spec.get("network") or {}
    subdomain = (network.get("subdomain") or jobset) if network.get("enableDNSHostnames", True) else None
    replicated_jobs = spec["replicatedJobs"]
    replicas = {rjob["name"]: int(rjob.get("replicas", 1)) for rjob in replicated_jobs}
    groups = {rjob["name"]: rjob.get("groupName", "default") for rjob in replicated_jobs}
    jobset_uid = str(uuid.uuid5(uuid.NAMESPACE_URL, f"jobset:{namespace}/{jobset}"))  # assigned by the API server
    coordinator = spec.get("coordinator")
    pods = []
    global_index = 0
    for position, rjob in enumerate(replicated_jobs):
        rjob_name, group = rjob["name"], groups[rjob["name"]]
        # Jobs of the same group before this replicatedJob's, for its job-group-index.
        group_before = sum(replicas[r["name"]] for r in replicated_jobs[:position] if groups[r["name"]] == group)
        job_spec = rjob["template"]["spec"]
        mode = job_spec.get("completionMode", "Indexed")
        if mode != "Indexed":
            raise RehearsalError(f"replicatedJob {rjob_name}: completionMode {mode}: its pods have no index and no stable hostname")
        if "completions" not in job_spec:
            raise RehearsalError(f"replicatedJob {rjob_name}: an Indexed Job needs completions")
        completions, parallelism = int(job_spec["completions"]), int(job_spec.get("parallelism", 1))
        if parallelism < completions:
            raise RehearsalError(f"replicatedJob {rjob_name}: parallelism {parallelism} starts only that many of its "
                                 f"{completions} pods at a time; a TensorFlow cluster needs all of them running")
        template_metadata = job_spec["template"].get("metadata") or {}
        for job_index in range(replicas[rjob_name]):
            job_name = f"{jobset}-{rjob_name}-{job_index}"
            jobset_keys = {
                "jobset.sigs.k8s.io/jobset-name": jobset,
                "jobset.sigs.k8s.io/jobset-uid": jobset_uid,
                "jobset.sigs.k8s.io/replicatedjob-name": rjob_name,
                # js.Status.Restarts when the Job is made: a restarted JobSet's pods read the new value.
                "jobset.sigs.k8s.io/restart-attempt": str(restart_attempt),
                "jobset.sigs.k8s.io/replicatedjob-replicas": str(replicas[rjob_name]),
                "jobset.sigs.k8s.io/global-replicas": str(sum(replicas.values())),
                "jobset.sigs.k8s.io/job-index": str(job_index),
                "jobset.sigs.k8s.io/job-key": hashlib.sha1(f"{namespace}/{job_name}".encode()).hexdigest(),
                "jobset.sigs.k8s.io/job-global-index": str(global_index + job_index),
                "jobset.sigs.k8s.io/group-name": group,
                "jobset.sigs.k8s.io/group-replicas": str(sum(n for r, n in replicas.items() if groups[r] == group)),
                "jobset.sigs.k8s.io/job-group-index": str(group_before + job_index),
            }
            if coordinator:
                jobset_keys["jobset.sigs.k8s.io/coordinator"] = (
                    f"{jobset}-{coordinator['replicatedJob']}-{coordinator.get('jobIndex', 0)}-"
                    f"{coordinator.get('podIndex', 0)}.{network.get('subdomain') or jobset}")
            job_uid = str(uuid.uuid5(uuid.NAMESPACE_URL, f"job:{namespace}/{job_name}/{restart_attempt}"))
            for index in range(completions):
                labels = {**(template_metadata.get("labels") or {}), **jobset_keys,
                          "batch.kubernetes.io/controller-uid": job_uid, "batch.kubernetes.io/job-name": job_name,
                          "controller-uid": job_uid, "job-name": job_name,
                          "batch.kubernetes.io/job-completion-index": str(index)}
                annotations = {**(template_metadata.get("annotations") or {}), **jobset_keys,
                               "batch.kubernetes.io/job-completion-index": str(index)}
                pods.append({"hostname": f"{job_name}-{index}", "subdomain": subdomain, "namespace": namespace,
                             "replicated_job": rjob_name, "job": job_name, "job_index": job_index,
                             "completion_index": index, "labels": labels, "annotations": annotations})
        global_index += replicas[rjob_name]
    return pods


def resolve_pod(identity: dict, manifest: dict, name: str) -> dict:
    """The pod `identity` named `name`, with its containers as the kubelet starts them."""
    pod = {"name": name, **identity}
    pod_spec = _pod_spec(manifest, identity["replicated_job"])
    pod["containers"] = [_pod_container(container, pod, pod_spec) for container in pod_spec["containers"]]
    pod["env"] = pod["containers"][0]["env"]
    return pod


def _pod_spec(manifest: dict, replicated_job: str) -> dict:
    rjob = next(r for r in manifest["spec"]["replicatedJobs"] if r["name"] == replicated_job)
    return rjob["template"]["spec"]["template"]["spec"]


_FIELD_PATH = re.compile(r"metadata\.(labels|annotations)\['([^']*)'\]")
_ENV_REFERENCE = re.compile(r"\$\$|\$\(([-._a-zA-Z][-._a-zA-Z0-9]*)\)")


def _expand(text: str, variables: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion: a defined variable's value, `$$` a literal `$`, anything else as is."""
    return _ENV_REFERENCE.sub(lambda match: "$" if match.group(0) == "$$" else variables.get(match.group(1), match.group(0)),
                              text)


def _pod_container(container: dict, pod: dict, pod_spec: dict) -> dict:
    """One container of `pod` with its environment, command and args as the kubelet and the runtime
    build them."""
    where = f"{pod['hostname']} container {container['name']}"
    if container.get("envFrom"):
        raise RehearsalError(f"{where}: envFrom reads ConfigMaps or Secrets, which exist only in a cluster")
    defined: dict[str, str] = {}  # what $(VAR) may refer to: the entries before it
    for entry in container.get("env", []):
        if "valueFrom" in entry:
            defined[entry["name"]] = _field_value(entry["valueFrom"], pod, pod_spec, f"{where} env {entry['name']}")
        else:
            defined[entry["name"]] = _expand(entry.get("value", ""), defined)
    # The Job controller adds JOB_COMPLETION_INDEX to every container that does not define it.
    defined.setdefault(trainer_cluster.JOB_COMPLETION_INDEX, str(pod["completion_index"]))
    command, args = container.get("command"), container.get("args")
    return {"name": container["name"], "image": container.get("image"),
            "command": None if command is None else [_expand(part, defined) for part in command],
            "args": None if args is None else [_expand(part, defined) for part in args],
            "ports": container.get("ports", []), "env": {"HOSTNAME": pod["hostname"], **defined}}


def _field_value(source: dict, pod: dict, pod_spec: dict, where: str) -> str:
    """A downward-API value, as the kubelet resolves it for `pod` (a missing label gives "")."""
    if set(source) != {"fieldRef"}:
        raise RehearsalError(f"{where}: valueFrom.{next(iter(source))} is known only inside a cluster")
    path = source["fieldRef"]["fieldPath"]
    match = _FIELD_PATH.fullmatch(path)
    if match:
        return pod[match.group(1)].get(match.group(2), "")
    known = {"metadata.name": pod["name"], "metadata.namespace": pod["namespace"],
             "spec.serviceAccountName": pod_spec.get("serviceAccountName", "default")}
    if path not in known:
        raise RehearsalError(f"{where}: fieldRef {path} is known only once the pod runs")
    return known[path]


def dns_names(pod: dict) -> tuple[str, ...]:
    """The names other pods reach `pod` by: through JobSet's headless Service only, never bare."""
    if not pod["subdomain"]:
        return ()
    short = f"{pod['hostname']}.{pod['subdomain']}"
    return short, f"{short}.{pod['namespace']}.svc", f"{short}.{pod['namespace']}.svc.cluster.local"


@dataclasses.dataclass(frozen=True)
class Pod:
    """One pod, ready to run as a container: plain values from the manifest alone."""

    name: str  # its hostname and 5 random characters, as Kubernetes names it
    hostname: str  # {job}-{completion index}
    subdomain: str | None
    job: str  # the Job's name: {jobset}-{replicatedJob}-{jobIndex}
    replicated_job: str
    image: str
    command: list[str]
    args: list[str]
    env: dict[str, str]
    container: str  # the container's name in the pod template
    # (source, mount path, read only): a persistentVolumeClaim's claim name, None for an emptyDir,
    # gs://BUCKET for a Cloud Storage FUSE CSI volume.
    mounts: list[tuple[str | None, str, bool]]
    gpus: int
    grace: int  # terminationGracePeriodSeconds
    aliases: tuple[str, ...]


def pods_of(manifest: dict, restart_attempt: int = 0, suffix: Callable[[str], str] = stable_suffix) -> list[Pod]:
    """The manifest's pods, ready to run as containers. Raises RehearsalError for what this machine
    cannot run."""
    manifest = admitted(manifest)
    return [pod_of(manifest, identity, f"{identity['hostname']}-{suffix(identity['hostname'])}")
            for identity in pod_identities(manifest, restart_attempt)]


def pod_of(manifest: dict, identity: dict, name: str) -> Pod:
    """The pod `identity` as it is created under `name` (an admitted manifest)."""
    pod = resolve_pod(identity, manifest, name)
    where = f"pod {identity['hostname']}"
    if len(pod["containers"]) != 1:
        raise RehearsalError(f"{where}: {len(pod['containers'])} containers; the rehearsal runs one per pod")
    container, pod_spec = pod["containers"][0], _pod_spec(manifest, identity["replicated_job"])
    template = pod_spec["containers"][0]
    if not container.get("image"):
        raise RehearsalError(f"{where}: its container has no image")
    gpus = int(((template.get("resources") or {}).get("limits") or {}).get("nvidia.com/gpu", 0) or 0)
    return Pod(name, identity["hostname"], identity["subdomain"], identity["job"], identity["replicated_job"],
               container["image"], list(container.get("command") or []), list(container.get("args") or []),
               dict(container["env"]), container["name"], _mounts(pod_spec, template, where), gpus,
               int(pod_spec.get("terminationGracePeriodSeconds", DEFAULT_GRACE_SECONDS)), dns_names(pod))


def _mounts(pod_spec: dict, container: dict, where: str) -> list[tuple[str | None, str, bool]]:
    volumes = {volume["name"]: volume for volume in pod_spec.get("volumes") or []}
    mounts = []
    for mount in container.get("volumeMounts") or []:
        volume = volumes.get(mount["name"])
        if volume is None:
            raise RehearsalError(f"{where}: volumeMount {mount['name']} names no volume of the pod")
        if "persistentVolumeClaim" in volume:
            source = volume["persistentVolumeClaim"]["claimName"]
        elif "emptyDir" in volume:
            source = None
        elif (volume.get("csi") or {}).get("driver") == GCS_FUSE_DRIVER:
            bucket = (volume["csi"].get("volumeAttributes") or {}).get("bucketName", "")
            if not re.fullmatch(BUCKET_NAME, bucket):
                raise RehearsalError(f"{where}: volume {mount['name']}: volumeAttributes.bucketName {bucket!r} is not a bucket name")
            source = f"gs://{bucket}"
        else:
            kind = next((key for key in volume if key != "name"), "?")
            raise RehearsalError(f"{where}: volume {mount['name']} is a {kind}; the rehearsal runs persistentVolumeClaim, "
                                 f"emptyDir and Cloud Storage FUSE ({GCS_FUSE_DRIVER}) volumes")
        mounts.append((source, mount["mountPath"], bool(mount.get("readOnly"))))
    return mounts


# --- The policies, as plain functions of what happened --------------------------------------------

def pod_failure_rule(job_spec: dict, exit_code: int, disrupted: bool, container: str = "") -> tuple[int, dict] | None:
    """(index, rule): the first of the Job's podFailurePolicy rules that matches a failed pod
    (Kubernetes' matchPodFailurePolicy); None when none does."""
    for index, rule in enumerate((job_spec.get("podFailurePolicy") or {}).get("rules", [])):
        on_codes, on_conditions = rule.get("onExitCodes"), rule.get("onPodConditions")
        if on_codes:
            if on_codes.get("containerName") not in (None, container):
                continue
            values = set(on_codes.get("values", []))
            # NotIn never matches exit code 0 (a container that succeeded did not fail the pod).
            if exit_code != 0 and (exit_code in values) == (on_codes.get("operator") == "In"):
                return index, rule
        elif on_conditions and disrupted and any(
                c.get("type") == "DisruptionTarget" and c.get("status", "True") == "True" for c in on_conditions):
            return index, rule
    return None


def pod_failure_action(job_spec: dict, exit_code: int, disrupted: bool, container: str = "") -> str:
    """FailJob, Ignore or Count (also when no rule matches) for a failed pod."""
    matched = pod_failure_rule(job_spec, exit_code, disrupted, container)
    return matched[1]["action"] if matched else "Count"


def pod_failure_message(job_spec: dict, exit_code: int, disrupted: bool, pod: Pod, namespace: str) -> str:
    """The failed Job's condition message when a FailJob rule matched, as the Job controller writes it."""
    index, rule = pod_failure_rule(job_spec, exit_code, disrupted, pod.container)
    if rule.get("onExitCodes"):
        return (f"Container {pod.container} for pod {namespace}/{pod.name} failed with exit code {exit_code} "
                f"matching {rule['action']} rule at index {index}")
    return f"Pod {namespace}/{pod.name} has condition DisruptionTarget matching {rule['action']} rule at index {index}"


def jobset_failure_rule(failure_policy: dict, replicated_job: str, reason: str, message: str) -> dict | None:
    """The first failurePolicy rule a failed Job matches (findFirstFailedPolicyRuleAndJob,
    ruleIsApplicable): its reasons, message patterns and target replicatedJobs all match; None when none."""
    for rule in failure_policy.get("rules") or []:
        reasons, targets = rule.get("onJobFailureReasons") or [], rule.get("targetReplicatedJobs") or []
        patterns = rule.get("onJobFailureMessagePatterns") or []
        if reasons and reason not in reasons:
            continue
        if patterns and not any(_search(pattern, message) for pattern in patterns):
            continue
        if targets and replicated_job not in targets:
            continue
        return rule
    return None


def _search(pattern: str, text: str) -> bool:
    # An invalid pattern never matches (anyMatchFound logs it and goes on).
    try:
        return re.search(pattern, text) is not None
    except re.error:
        return False


def jobset_failure_action(failure_policy: dict, replicated_job: str, reason: str, message: str = "") -> str:
    """FailJobSet, RestartJobSet or RestartJobSetAndIgnoreMaxRestarts for a failed Job; the
    default is RestartJobSet (defaultFailurePolicyRuleAction)."""
    rule = jobset_failure_rule(failure_policy, replicated_job, reason, message)
    return rule["action"] if rule else "RestartJobSet"


def crash_loop_delay(restarts: int) -> float:
    """The kubelet's back-off before the `restarts`-th restart in place of a container."""
    return min(CRASH_LOOP_FIRST_SECONDS * 2 ** max(restarts - 1, 0), CRASH_LOOP_MAX_SECONDS)


# --- The rules ------------------------------------------------------------------------------------

@dataclasses.dataclass
class Job:
    """One of the JobSet's Jobs in the current attempt."""

    name: str
    replicated_job: str
    spec: dict  # the Job's spec (the replicatedJob's template.spec)
    created: float
    hostnames: list[str] = dataclasses.field(default_factory=list)
    succeeded: set = dataclasses.field(default_factory=set)  # hostnames whose pod completed
    counted_failures: int = 0  # pods failed and counted against backoffLimit (restartPolicy Never)
    restarts_in_place: int = 0  # container restarts (restartPolicy OnFailure)
    finished: str | None = None  # "Complete" or "Failed"

    @property
    def backoff_limit(self) -> int:
        return int(self.spec.get("backoffLimit", DEFAULT_BACKOFF_LIMIT))

    @property
    def restart_policy(self) -> str:
        return self.spec["template"]["spec"]["restartPolicy"]


class JobSetRules:
    """One JobSet from its creation to its end, with JobSet's and Kubernetes' rules."""

    def __init__(self, manifest: dict, output: Output, *, network: str, bucket_directory=None):
        self.manifest = admitted(manifest)
        self.output, self.network = output, network
        self.bucket_directory = bucket_directory  # gs:// bucket -> its files here, for CSI volumes
        spec = self.manifest["spec"]
        self.name = self.manifest["metadata"]["name"]
        self.rjobs = {rjob["name"]: rjob for rjob in spec["replicatedJobs"]}
        self.failure_policy = spec.get("failurePolicy")
        success = spec["successPolicy"]
        self.success_operator = success.get("operator", "All")
        self.success_targets = success.get("targetReplicatedJobs") or list(self.rjobs)
        self.blocking = (self.failure_policy or {}).get("restartStrategy") == "BlockingRecreate"
        self.in_order = spec["startupPolicy"].get("startupPolicyOrder") == "InOrder"
        self.restarts = 0  # js.Status.Restarts: every restart; the new pods' restart-attempt
        self.restarts_counted = 0  # js.Status.RestartsCountTowardsMax
        self.pods = pods_of(self.manifest)  # every pod resolves now: a bad manifest stops before anything runs
        self.hostnames = [pod.hostname for pod in self.pods]

    def hosts(self) -> tuple[str, ...]:
        return tuple(alias for pod in self.pods for alias in pod.aliases)

    def container(self, run: Run, pod: Pod) -> Container:
        volumes = []
        for source, path, read_only in pod.mounts:
            if source is None:
                volume = path  # an anonymous volume of this container alone
            elif source.startswith("gs://"):
                if self.bucket_directory is None:
                    raise RehearsalError(f"pod {pod.hostname}: a Cloud Storage FUSE volume needs the local Cloud Storage "
                                         "(not --real-gcs)")
                volume = f"{self.bucket_directory(source[len('gs://'):])}:{path}"
            else:
                volume = f"{run.volume(source)}:{path}"
            volumes.append(volume + (":ro" if read_only else ""))
        return Container(key=pod.hostname, name=f"{self.network}-{pod.name}", hostname=pod.hostname, image=pod.image,
                         command=tuple(pod.command), args=tuple(pod.args), env=pod.env, aliases=pod.aliases,
                         volumes=tuple(volumes), labels={"jobset.sigs.k8s.io/restart-attempt": str(self.restarts)},
                         gpus=pod.gpus > 0, grace=pod.grace)

    def new_pod(self, run: Run, hostname: str) -> None:
        """The Job creates a pod for `hostname`: a new name, this attempt's labels."""
        identity = self.identities[hostname]
        pod = pod_of(self.manifest, identity, f"{hostname}-{random_suffix(hostname)}")
        self.current[hostname] = pod
        run.launch(self.container(run, pod))

    # the attempt

    def begin(self, run: Run, attempt: int) -> None:
        self.identities = {identity["hostname"]: identity for identity in pod_identities(self.manifest, self.restarts)}
        self.current: dict[str, Pod] = {}
        self.jobs: dict[str, Job] = {}
        self.pending: list[tuple[float, str]] = []  # (when, hostname): restarts in place after their back-off
        self.launched: list[str] = []  # replicatedJobs whose Jobs exist
        self.create_ready_jobs(run)

    def create_ready_jobs(self, run: Run) -> None:
        """Creates the Jobs of every replicatedJob whose dependencies have reached their status
        (reconcileReplicatedJobs, dependencyReachedStatus), judged on the state before this pass:
        a Job created now is not yet Ready for the next replicatedJob."""
        order = list(self.rjobs)
        ready = []
        for position, name in enumerate(order):
            needs = [(d["name"], d["status"]) for d in self.rjobs[name].get("dependsOn") or []]
            if self.in_order and position:
                needs.append((order[position - 1], "Ready"))
            if name not in self.launched and all(self.reached(run, dependency, status) for dependency, status in needs):
                ready.append((name, needs))
        for name, needs in ready:
            if needs:
                self.output.note(f"{name}: {' and '.join(f'{d} is {s}' for d, s in needs)}: creating its Jobs")
            self.launched.append(name)
            for identity in self.identities.values():
                if identity["replicated_job"] == name:
                    job = self.jobs.setdefault(identity["job"], Job(identity["job"], name, self.rjobs[name]["template"]["spec"],
                                                                    time.monotonic()))
                    job.hostnames.append(identity["hostname"])
                    self.new_pod(run, identity["hostname"])

    def job_of(self, hostname: str) -> Job:
        return self.jobs[self.identities[hostname]["job"]]

    def reached(self, run: Run, replicated_job: str, status: str) -> bool:
        """Whether every Job of `replicated_job` is Complete, or Ready: each pod running or done (no
        readiness probe is emulated); a failed Job counts as Ready, as JobSet counts it."""
        jobs = [job for job in self.jobs.values() if job.replicated_job == replicated_job]
        if len(jobs) < int(self.rjobs[replicated_job]["replicas"]):
            return False
        if status == "Complete":
            return all(job.finished == "Complete" for job in jobs)
        return all(job.finished or all(h in job.succeeded or run.started(h) for h in job.hostnames) for job in jobs)

    def disrupt(self, run: Run, container: Container, fault: Fault) -> float:
        self.output.note(f"evicting {container.key} (node preempted): SIGTERM now, SIGKILL in {container.grace:g}s",
                         "WARNING")
        return container.grace

    def exited(self, run: Run, container: Container, code: int, fault: Fault | None):
        job = self.job_of(container.key)
        if job.finished:
            return None
        if code == 0:
            job.succeeded.add(container.key)
            if len(job.succeeded) == len(job.hostnames):
                job.finished = "Complete"
                if self.succeeded():
                    return Outcome(0, "succeeded (successPolicy met)")
            return None  # whether the JobSet is stuck is judged in tick, once every exit of this poll is in
        if job.restart_policy == "OnFailure":
            # pastBackoffLimitOnFailure: the containers' restarts, summed over the Job's pods.
            job.restarts_in_place += 1
            if job.restarts_in_place >= max(job.backoff_limit, 1):
                return self.job_failed(run, job, "BackoffLimitExceeded", BACKOFF_MESSAGE, code, container.key)
            delay = crash_loop_delay(job.restarts_in_place)
            self.output.note(f"{container.key} exited {code}: the kubelet restarts its container in place in "
                             f"{delay:g}s (restartPolicy OnFailure)", "WARNING")
            self.pending.append((time.monotonic() + delay, container.key))
            return None
        pod, disrupted = self.current[container.key], fault is not None
        action = pod_failure_action(job.spec, code, disrupted, pod.container)
        if action == "FailJob":
            message = pod_failure_message(job.spec, code, disrupted, pod, self.identities[pod.hostname]["namespace"])
            return self.job_failed(run, job, "PodFailurePolicy", message, code, container.key)
        if action == "Count":
            job.counted_failures += 1
            if job.counted_failures > job.backoff_limit:
                return self.job_failed(run, job, "BackoffLimitExceeded", BACKOFF_MESSAGE, code, container.key)
        self.output.note(f"{container.key} exited {code}: Job {job.name} recreates it ({action})", "WARNING")
        self.new_pod(run, container.key)
        return None

    def job_failed(self, run: Run, job: Job, reason: str, message: str, code: int, hostname: str | None):
        """A Job failed: its pods stop, and the JobSet's failurePolicy decides (executeFailurePolicy)."""
        job.finished = "Failed"
        run.stop([c for c in run.running() if c.key in job.hostnames])
        failed = f"Job {job.name} failed ({reason}): " + (f"pod {hostname} exited {code}" if hostname else message)
        if self.failure_policy is None:
            return Outcome(code, f"failed: {failed} (no failurePolicy: a failed Job fails the JobSet)")
        rule = jobset_failure_rule(self.failure_policy, job.replicated_job, reason, message)
        action = rule["action"] if rule else "RestartJobSet"
        limit = int(self.failure_policy.get("maxRestarts", 0))
        if action == "FailJobSet":
            return Outcome(code, f"failed: {failed} (failurePolicy: FailJobSet, rule {rule['name']})")
        if action == "RestartJobSet" and self.restarts_counted >= limit:
            return Outcome(code, f"failed: {failed} (maxRestarts {limit} reached)")
        self.restarts += 1
        counted = action == "RestartJobSet"
        self.restarts_counted += counted
        shown = f"restart {self.restarts_counted} of {limit}" if counted else f"restart {self.restarts}, not counted"
        how = "" if self.blocking else "; Recreate: the new pods start while the old ones stop"
        self.output.note(f"{failed}: JobSet recreates every Job ({action}, {shown}{how})", "WARNING")
        return Restart(blocking=self.blocking)

    def succeeded(self) -> bool:
        """executeSuccessPolicy: enough of the target replicatedJobs' Jobs are complete."""
        complete = [job for job in self.jobs.values()
                    if job.finished == "Complete" and job.replicated_job in self.success_targets]
        expected = 1 if self.success_operator == "Any" else sum(int(self.rjobs[r]["replicas"]) for r in self.success_targets)
        return len(complete) >= expected

    def stuck(self, run: Run):
        """Nothing runs, nothing waits, and the successPolicy is not met: on a cluster the JobSet
        would stay active for ever; the rehearsal ends instead. Asked after every exit the runner
        reaped in one poll has been judged: pods that end together can meet the policy together."""
        if run.running() or self.pending or len(self.launched) < len(self.rjobs):
            return None
        return Outcome(1, "every pod has ended, but the successPolicy is not met: on a cluster the JobSet would "
                          "stay active until deleted")

    def tick(self, run: Run, now: float):
        for when, hostname in [p for p in self.pending if p[0] <= now]:
            self.pending.remove((when, hostname))
            run.launch(run.last[hostname], fresh=False)  # the same container again: the same pod
        for job in self.jobs.values():
            deadline = job.spec.get("activeDeadlineSeconds")
            if not job.finished and deadline is not None and now - job.created > float(deadline):
                return self.job_failed(run, job, "DeadlineExceeded", f"{DEADLINE_MESSAGE} ({deadline}s)",
                                       DEADLINE_EXIT, None)
        if len(self.launched) < len(self.rjobs):
            self.create_ready_jobs(run)
        return self.stuck(run)


def parse_eviction(text: str) -> Fault:
    """POD@SECONDS or POD@/REGEX/ (POD is a hostname such as cassava-multiworker-worker-0-1): the
    pod's node is preempted then, or when the pod prints a matching line."""
    return parse_fault(text, EVICTION, "--preempt", POD_NAME, "myjob-worker-0-1@40")


def not_emulated(manifest: dict) -> str:
    """The one line that names every field of the JobSet the rehearsal does not emulate."""
    unknown = fields.not_emulated(manifest, EMULATED)
    return ("not emulated, every pod runs here at once on this machine's CPUs: "
            + ("; ".join(unknown) if unknown else "nothing else the JobSet asks"))


def check(manifest: dict, faults=()) -> None:
    """Raises RehearsalError, one line, for a manifest or a fault the rehearsal cannot run."""
    hostnames = [pod.hostname for pod in pods_of(manifest)]
    for fault in faults:
        if fault.replica not in hostnames:
            raise RehearsalError(f"--preempt {fault.replica}: the JobSet has no such pod ({', '.join(sorted(hostnames))})")


def run(session: Session, manifest: dict, run_id: str, faults=(), bucket_directory=None) -> int:
    """Runs the JobSet; returns the rehearsal's exit code."""
    check(manifest, faults)
    network = f"{PREFIX}{run_id}"
    rules = JobSetRules(manifest, session.output, network=network, bucket_directory=bucket_directory)
    session.output.note(f"JobSet {rules.name}: {len(rules.pods)} pods on this machine")
    session.output.note(not_emulated(manifest))
    job = Run(session, network, hosts=rules.hosts())
    outcome = drive(job, rules, faults)
    for line in job.summary(rules.hostnames):
        session.output.note(line)
    session.output.note(f"JobSet {rules.name}: {outcome.message}", "INFO" if outcome.code == 0 else "ERROR")
    return outcome.code
