"""A JobSet manifest as a user hands it over: read from YAML or JSON, and the fields the rehearsal
does not emulate, named once at the start."""

from __future__ import annotations

from scripts.rehearsal import fields
from scripts.rehearsal.runner import RehearsalError

API_VERSION = "jobset.x-k8s.io/v1alpha2"

# What the rehearsal emulates of a JobSet (fields.py); everything else is named once, at the start.
_POD_SPEC = {"restartPolicy": fields.ALL, "terminationGracePeriodSeconds": fields.ALL, "volumes": fields.ALL,
             "serviceAccountName": fields.ALL,
             "containers": [{"name": fields.ALL, "image": fields.ALL, "command": fields.ALL, "args": fields.ALL,
                             "env": fields.ALL, "ports": fields.ALL, "volumeMounts": fields.ALL,
                             "readinessProbe": fields.ALL, "startupProbe": fields.ALL,
                             "resources": {"limits": {"nvidia.com/gpu": fields.ALL}}}]}
EMULATED = {
    "apiVersion": fields.ALL, "kind": fields.ALL,
    "metadata": {"name": fields.ALL, "namespace": fields.ALL},
    "spec": {
        "network": fields.ALL, "successPolicy": fields.ALL, "failurePolicy": fields.ALL, "coordinator": fields.ALL,
        "startupPolicy": fields.ALL, "suspend": fields.ALL,
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



def not_emulated(manifest: dict) -> str:
    """The one line that names every field of the JobSet the rehearsal does not emulate."""
    unknown = fields.not_emulated(manifest, EMULATED)
    return ("not emulated, every pod runs here on this machine's CPUs: "
            + ("; ".join(unknown) if unknown else "nothing else the JobSet asks"))
