"""Every pod of a JobSet, ready to run as one container: its identity (identity.py), its container
(environment.py), its volumes, GPUs, grace and probes (probes.py)."""

from __future__ import annotations

import dataclasses
import re
from typing import Callable

from scripts.rehearsal.jobset.admission import admitted
from scripts.rehearsal.jobset.environment import pod_spec_of, resolve_pod
from scripts.rehearsal.jobset.identity import dns_names, pod_identities, stable_suffix
from scripts.rehearsal.jobset.probes import Probe, container_probes
from scripts.rehearsal.runner import RehearsalError
from scripts.rehearsal.storage import BUCKET_NAME

DEFAULT_GRACE_SECONDS = 30  # a pod's default terminationGracePeriodSeconds

GCS_FUSE_DRIVER = "gcsfuse.csi.storage.gke.io"  # GKE's Cloud Storage FUSE CSI driver
ALL_BUCKETS = "_"  # the driver's bucketName for dynamic mounting


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
    # gs://BUCKET for a Cloud Storage FUSE CSI volume (gs://_ for every bucket).
    mounts: list[tuple[str | None, str, bool]]
    gpus: int
    grace: int  # terminationGracePeriodSeconds
    aliases: tuple[str, ...]
    probes: tuple[Probe, ...] = ()  # its container's startup and readiness probes


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
    container, pod_spec = pod["containers"][0], pod_spec_of(manifest, identity["replicated_job"])
    template = pod_spec["containers"][0]
    if not container.get("image"):
        raise RehearsalError(f"{where}: its container has no image")
    gpus = int(((template.get("resources") or {}).get("limits") or {}).get("nvidia.com/gpu", 0) or 0)
    return Pod(name, identity["hostname"], identity["subdomain"], identity["job"], identity["replicated_job"],
               container["image"], list(container.get("command") or []), list(container.get("args") or []),
               dict(container["env"]), container["name"], _mounts(pod_spec, template, where), gpus,
               int(pod_spec.get("terminationGracePeriodSeconds", DEFAULT_GRACE_SECONDS)), dns_names(pod),
               container_probes(template, f"{where} container {container['name']}"))


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
            # "_" is the driver's dynamic mounting: every bucket the pod's service account can read,
            # each a directory of the mount (gcs-fuse-csi-driver docs/usage.md).
            if bucket != ALL_BUCKETS and not re.fullmatch(BUCKET_NAME, bucket):
                raise RehearsalError(f"{where}: volume {mount['name']}: volumeAttributes.bucketName {bucket!r} is not a bucket name")
            source = f"gs://{bucket}"
        else:
            kind = next((key for key in volume if key != "name"), "?")
            raise RehearsalError(f"{where}: volume {mount['name']} is a {kind}; the rehearsal runs persistentVolumeClaim, "
                                 f"emptyDir and Cloud Storage FUSE ({GCS_FUSE_DRIVER}) volumes")
        mounts.append((source, mount["mountPath"], bool(mount.get("readOnly"))))
    return mounts
