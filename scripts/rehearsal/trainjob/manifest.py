"""TrainJobs and training runtimes as a user hands them over: read from YAML or JSON, with the
runtimes this project ships (manifests/runtimes/) installed unless others are given."""

from __future__ import annotations

import sys
from pathlib import Path

from scripts.rehearsal.runner import RehearsalError

API_VERSION = "trainer.kubeflow.org/v1alpha1"
TRAINJOB = "TrainJob"
CLUSTER_RUNTIME, RUNTIME = "ClusterTrainingRuntime", "TrainingRuntime"
RUNTIME_KINDS = (CLUSTER_RUNTIME, RUNTIME)
RUNTIMES_DIR = Path(__file__).resolve().parents[3] / "manifests" / "runtimes"


def documents(path: str) -> list[dict]:
    """Every YAML (or JSON) document in `path` ('-' for stdin)."""
    import yaml

    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text()
        return [doc for doc in yaml.safe_load_all(text) if isinstance(doc, dict)]
    except (OSError, yaml.YAMLError) as error:
        raise RehearsalError(f"{path}: {str(error).splitlines()[0]}") from None


def of_kind(docs: list[dict], kinds: tuple[str, ...], where: str) -> list[dict]:
    """The documents of these kinds; one whose apiVersion is not trainer.kubeflow.org/v1alpha1 is refused."""
    found = [doc for doc in docs if doc.get("kind") in kinds]
    for doc in found:
        if doc.get("apiVersion") != API_VERSION:
            raise RehearsalError(f"{where}: {doc['kind']} {doc.get('metadata', {}).get('name')!r} has apiVersion "
                                 f"{doc.get('apiVersion')!r}; Kubeflow Trainer v2.3.0 serves {API_VERSION}")
    return found


def load(path: str) -> tuple[dict, list[dict]]:
    """(the first TrainJob in `path`, the runtimes the same file holds)."""
    docs = documents(path)
    trainjobs = of_kind(docs, (TRAINJOB,), path)
    if not trainjobs:
        raise RehearsalError(f"{path}: no TrainJob in it (kind: TrainJob)")
    return trainjobs[0], of_kind(docs, RUNTIME_KINDS, path)


def runtimes_in(paths) -> list[dict]:
    """The runtimes of these files (a directory: its *.yaml files)."""
    found = []
    for path in paths:
        files = sorted(Path(path).glob("*.yaml")) if Path(path).is_dir() else [Path(path)]
        for file in files:
            found += of_kind(documents(str(file)), RUNTIME_KINDS, str(file))
    return found


def shipped_runtimes() -> list[dict]:
    """The ClusterTrainingRuntimes of manifests/runtimes/, as `kubectl apply -f manifests/runtimes/` installs them."""
    return runtimes_in([RUNTIMES_DIR])


def with_image(runtime: dict, image: str) -> dict:
    """The runtime with every container's image replaced (a registry of your own, or a local tag)."""
    import copy

    runtime = copy.deepcopy(runtime)
    for rjob in runtime["spec"]["template"]["spec"]["replicatedJobs"]:
        for container in rjob["template"]["spec"]["template"]["spec"]["containers"]:
            container["image"] = image
    return runtime
