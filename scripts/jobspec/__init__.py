"""Job specs for Vertex AI, AI Platform Training, Kubeflow TFJob, JobSet and Kubeflow Trainer's
TrainJob, as plain dicts, from one request: one module per platform. Pure functions: no cloud SDK, no network.
`scripts/submit_job.py` prints or submits what these build; the tests load them into each
platform's own schema. `cluster_environments` derives the TF_CONFIG / CLUSTER_SPEC each replica
would be given, as each platform sets them, so the specs can be checked against `trainer.cluster`
without running anything (a JobSet's pods: scripts/rehearsal/jobset/).

| module                        | builds                                                            |
|-------------------------------|-------------------------------------------------------------------|
| scripts/jobspec/request.py    | the request every spec is built from, validated once: pools, faults, Vertex's capacity options |
| scripts/jobspec/accelerators.py | the machine and GPU table the request is checked against, with its sources |
| scripts/jobspec/vertex.py     | a CustomJob, a tuning job, the self-check job (aiplatform v1)     |
| scripts/jobspec/ai_platform.py| a retired AI Platform Training config.yaml (ml v1)                |
| scripts/jobspec/tfjob.py      | a Kubeflow training-operator v1 TFJob                              |
| scripts/jobspec/jobset.py     | a JobSet (jobset.x-k8s.io/v1alpha2)                                |
| scripts/jobspec/trainjob.py   | a Kubeflow Trainer v2 TrainJob on a TensorFlow runtime (manifests/runtimes/), and the strict check of TrainJobs and runtimes |

This file only hands their public names on, so that `from scripts import jobspec` reads them all.
"""

from scripts.jobspec import ai_platform, tfjob, vertex
from scripts.jobspec.ai_platform import AI_PLATFORM_HEADER, ai_platform_config
from scripts.jobspec.jobset import jobset_container_env, jobset_header, jobset_manifest
from scripts.jobspec.request import (DEFAULT_MAX_RESTARTS, REDUCTION_SERVER_IMAGES, REDUCTION_SERVER_MACHINE_TYPE, JobRequest,
                                     Pool, SpecError, VertexOptions, accelerator_warnings, build_request, parse_duration,
                                     vertex_only)
from scripts.jobspec.tfjob import TFJOB_HEADER, tfjob_manifest
from scripts.jobspec.trainjob import trainjob_header, trainjob_manifest, trainjob_warnings
from scripts.jobspec.vertex import Tuning, vertex_custom_job, vertex_selfcheck_job, vertex_tuning_job

_ENVIRONMENTS = {"vertex": vertex.replica_environments, "ai-platform": ai_platform.replica_environments,
                 "tfjob": tfjob.replica_environments}


def cluster_environments(platform: str, spec: dict) -> list[dict[str, str]]:
    """The cluster variables every replica of `spec` gets, as `platform` (vertex, ai-platform or
    tfjob) would set them. A JobSet sets none (scripts/rehearsal/jobset/ makes its pods)."""
    if platform not in _ENVIRONMENTS:
        raise ValueError(f"unknown platform {platform!r}")
    return _ENVIRONMENTS[platform](spec)
