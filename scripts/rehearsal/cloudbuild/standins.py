"""What runs each step's image here, where Google's registries cannot be reached: a local stand-in
with the same tools (standins/docker, standins/gcloud), CI's stand-in base for the python image, or
an image the engine already has. Named, all of them, in one line at the start of the build.

`plan` is a pure function of the steps' image names; `ensure` builds the stand-ins (buildah, from
CI's stand-in base, tagged by a hash of their files and that base, so a changed stand-in is a new
image and an unchanged one is built once).
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
import subprocess
from pathlib import Path
from typing import Callable, Iterable

from scripts.rehearsal import engine as engines

HERE = Path(__file__).resolve().parent / "standins"
REPO = Path(__file__).resolve().parents[3]


@dataclasses.dataclass(frozen=True)
class StandIn:
    kind: str  # docker, gcloud, python
    pattern: re.Pattern  # the step images it stands in for
    what: str  # what the one line at start says

    @property
    def directory(self) -> Path | None:
        return HERE / self.kind if self.kind in ("docker", "gcloud") else None


STANDINS = (
    StandIn("docker", re.compile(r"^(?:[a-z0-9-]+\.)?gcr\.io/cloud-builders/docker(?:[:@]|$)"),
            "the docker CLI (Debian's 20.10.24) on the engine's API socket, building FROM CI's stand-in base where a "
            "Dockerfile's base is a pinned production image"),
    StandIn("gcloud", re.compile(r"^(?:[a-z0-9-]+\.)?gcr\.io/(?:google\.com/cloudsdktool/(?:google-cloud-cli|cloud-sdk)"
                                 r"|cloud-builders/gcloud)(?:[:@]|$)"),
            "a gcloud that answers `artifacts docker images scan` and `list-vulnerabilities` from the vulnerabilities "
            "file (On-Demand Scanning's occurrences; none by default) and records `artifacts sbom load`"),
    StandIn("python", re.compile(r"^(?:docker\.io/)?(?:library/)?python:3\.11[.\w-]*(?:@sha256:[0-9a-f]{64})?$"),
            "CI's stand-in base (python.org's 3.11 in /usr/local, Debian bookworm)"),
)


class StandInError(RuntimeError):
    """str() is one line."""


def standin_for(image: str) -> StandIn | None:
    return next((standin for standin in STANDINS if standin.pattern.match(image)), None)


def plan(images: Iterable[str], available: Callable[[str], bool]) -> dict[str, StandIn | None]:
    """Each distinct step image: its stand-in, or None when the engine has it and it runs as it is.
    Raises StandInError for one that has neither: the rehearsal pulls nothing."""
    chosen = {}
    for image in dict.fromkeys(images):
        standin = standin_for(image)
        if standin is None and not available(image):
            raise StandInError(f"step image {image}: the rehearsal has no stand-in for it and the engine does not "
                               "have it (nothing is pulled here); build or tag it locally first")
        chosen[image] = standin
    return chosen


def line(chosen: dict[str, StandIn | None], base: str) -> str:
    """The one line at start that names every stand-in."""
    parts = []
    for image, standin in chosen.items():
        short = image.split("@", 1)[0]
        parts.append(f"{short} -> {standin.what}" if standin else f"{short} -> the engine's own image")
    parts.append("the Dockerfiles' pinned bases -> CI's stand-in base " + base)
    parts.append("Artifact Registry -> a local registry (docker-registry) reached through the engine")
    parts.append("not emulated: provenance (SLSA), IAM and the build's service account, Cloud Logging, machine types")
    return "stand-ins: " + "; ".join(parts)


def tag_of(standin: StandIn, base_id: str) -> str:
    digest = hashlib.sha256(base_id.encode())
    for path in sorted(standin.directory.rglob("*")):
        if path.is_file():
            digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return f"localhost/cloudbuild-standin-{standin.kind}:{digest.hexdigest()[:12]}"


def standin_base(environ: dict[str, str]) -> str:
    """CI's stand-in base (scripts/supply_chain/standin_base.sh), made if the engine lacks it."""
    result = subprocess.run(["bash", str(REPO / "scripts" / "supply_chain" / "standin_base.sh")], capture_output=True,
                            text=True, env=environ, cwd=REPO)
    if result.returncode != 0:
        raise StandInError(f"CI's stand-in base could not be made: {result.stderr.strip().splitlines()[-1:]}")
    return result.stdout.strip().splitlines()[-1]


def ensure(chosen: dict[str, StandIn | None], base: str, engine, environ: dict[str, str], note) -> dict[str, str]:
    """Each step image -> the local image that runs it, building the stand-ins the engine lacks."""
    base_id = engine("image", "inspect", "--format", "{{.Id}}", base).strip()
    local = {}
    for image, standin in chosen.items():
        if standin is None:
            local[image] = image
        elif standin.directory is None:
            local[image] = base
        else:
            tag = tag_of(standin, base_id)
            if engine.run("image", "inspect", "--format", "{{.Id}}", tag).returncode != 0:
                note(f"building the {standin.kind} stand-in {tag}")
                built = engines.build("buildah", ["--build-arg", f"BASE_IMAGE={base}", "-t", tag, str(standin.directory)],
                                      environ, note=note)
                if built.returncode != 0:
                    raise StandInError(f"the {standin.kind} stand-in did not build: "
                                       f"{(built.stderr.strip().splitlines() or ['?'])[-1]}")
            local[image] = tag
    return local
