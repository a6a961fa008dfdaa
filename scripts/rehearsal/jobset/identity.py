"""Who each pod is, from the manifest alone: JobSet's Jobs `{jobset}-{replicatedJob}-{jobIndex}`,
the labels and annotations JobSet puts on their pods (constructJob, labelAndAnnotateObject in
pkg/controllers/jobset_controller.go), the Indexed Job's hostname `{job}-{index}` and completion
index, the pod's generated name, and the names other pods reach it by."""

from __future__ import annotations

import hashlib
import random
import uuid

from scripts.rehearsal.runner import RehearsalError

# generateName's random suffix alphabet (k8s.io/apiserver names.go: no vowels, no look-alikes).
_SUFFIX_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"


def stable_suffix(hostname: str) -> str:
    """Five characters of generateName's alphabet, the same for the same hostname (for specs read
    without running them); a running rehearsal draws them at random for each new pod."""
    digest = hashlib.sha1(hostname.encode()).digest()
    return "".join(_SUFFIX_ALPHABET[b % len(_SUFFIX_ALPHABET)] for b in digest[:5])


def random_suffix(_hostname: str) -> str:
    return "".join(random.choice(_SUFFIX_ALPHABET) for _ in range(5))


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
        completions, parallelism = int(job_spec["completions"]), int(job_spec["parallelism"])  # admitted: defaulted
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



def dns_names(pod: dict) -> tuple[str, ...]:
    """The names other pods reach `pod` by: through JobSet's headless Service only, never bare."""
    if not pod["subdomain"]:
        return ()
    short = f"{pod['hostname']}.{pod['subdomain']}"
    return short, f"{short}.{pod['namespace']}.svc", f"{short}.{pod['namespace']}.svc.cluster.local"
