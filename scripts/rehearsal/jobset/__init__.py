"""JobSet's rules over the runner: a JobSet's pods as Kubernetes and the JobSet controller run them.

Read from kubernetes-sigs/jobset v0.12.0 (pkg/webhooks/jobset_webhook.go, pkg/controllers/) and
Kubernetes' Job controller (pkg/controller/job: job_controller.go, pod_failure_policy.go); each
rule below names the function it follows.

Before anything runs, `admitted` applies what the API server would: the JobSet webhook's defaults
(Default), Kubernetes' Job defaults (SetDefaults_Job), and what the webhook and Kubernetes' Job
validation refuse, refused here with one line.

Each pod (`jobset_pods`) gets what the cluster gives it: the hostname `{job}-{index}` of its
Indexed Job `{jobset}-{replicatedJob}-{jobIndex}`, a name with 5 random characters after it, the
JobSet's labels and annotations (restart-attempt is the JobSet's restart count, so a new attempt's
pods read the new value), and each container's environment with the downward API resolved,
JOB_COMPLETION_INDEX set and the API server's service links (KUBERNETES_SERVICE_HOST and the rest)
added, as in every Kubernetes pod. Other pods reach it only as `{hostname}.{subdomain}` (and its
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
- the Jobs failed by the end of a poll (every exit the runner reaped at once, as one reconcile
  sees them) go through the JobSet's failurePolicy (failure_policy.go) before its successPolicy:
  no policy fails the JobSet; the rules are tried in order, each over every failed Job, and the
  first whose onJobFailureReasons, onJobFailureMessagePatterns and targetReplicatedJobs all
  match one of them decides (for the earliest such Job), else RestartJobSet. RestartJobSet recreates every Job
  while fewer than maxRestarts restarts counted towards it, else fails the JobSet;
  RestartJobSetAndIgnoreMaxRestarts recreates them uncounted. Recreate starts the new pods while
  the old ones take their grace; BlockingRecreate waits until every old pod is gone;
- a replicatedJob with dependsOn starts once each dependency is Ready (every Job ready: each pod
  Ready or done) or Complete (depends_on.go); startupPolicy InOrder waits on the one before Ready;
  a pod is Ready when its container has started and its readiness probe succeeded, the kubelet's
  readiness and startup probes run as pkg/kubelet/prober runs them (probes.py, prober.py);
- the JobSet succeeds by its successPolicy (success_policy.go), and the pods still running stop.

Stopping a pod is SIGTERM, then SIGKILL after its terminationGracePeriodSeconds (default 30).

| module            | its one concern                                                              |
|-------------------|------------------------------------------------------------------------------|
| manifest.py       | reading a manifest; the fields not emulated                                  |
| admission.py      | the webhook's and Kubernetes' defaults, and what they refuse                  |
| identity.py       | each pod's Job, hostname, name, labels, annotations and DNS names             |
| environment.py    | each container's environment: downward API, service links, `$(VAR)` expansion |
| pods.py           | each pod ready to run: identity, container, volumes, GPUs, grace              |
| failure_policy.py | podFailurePolicy, backoffLimit, the crash-loop back-off, the failurePolicy    |
| success_policy.py | the successPolicy                                                            |
| depends_on.py     | dependsOn and startupPolicy InOrder                                          |
| probes.py         | readiness and startup probes: their defaults, and each worker's state         |
| prober.py         | running one probe: exec in the container, httpGet and tcpSocket to the pod    |
| controller.py     | one JobSet's lifecycle over the runner, applying the rules above             |
"""

from scripts.rehearsal.jobset.controller import check, parse_eviction, run
from scripts.rehearsal.jobset.manifest import load, not_emulated
from scripts.rehearsal.jobset.pods import jobset_pods, pods_of

__all__ = ["check", "jobset_pods", "load", "not_emulated", "parse_eviction", "pods_of", "run"]
