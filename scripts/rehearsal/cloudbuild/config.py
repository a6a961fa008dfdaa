"""A build config, read as Cloud Build reads it: loaded into Cloud Build's own `Build` message
(google-cloud-build's cloudbuild_v1, the API's schema) with unknown fields refused, then the checks
Cloud Build makes before it runs anything, then substituted. Pure functions of the document.

The checks, from GoogleCloudPlatform/cloud-build-local's validate/validate.go (CheckBuild,
CheckBuildSteps) with its messages: at least one step, each with a name; a `waitFor` names an
earlier step's id or "-"; ids are unique and never "-"; `env` entries are KEY=VALUE; a step's
timeout is at most the build's; the build's at most 24 hours. The build's timeout is 10 minutes
when the config gives none (the build config schema page, "timeout"). After substitution every
`images:` entry must be an image reference: Cloud Build refuses "invalid image name ...: could not
parse reference" before any step runs (googleapis/java-shared-config#1016 quotes one).
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import yaml

from scripts.rehearsal import fields
from scripts.rehearsal.cloudbuild import substitutions as subst

DEFAULT_TIMEOUT_SECONDS = 600
MAX_TIMEOUT_SECONDS = 24 * 3600
START = "-"  # waitFor: ["-"] starts a step when the build starts
# Docker's reference grammar (distribution/reference), the part a tag or digest pin needs.
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_DOMAIN = r"(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*(?::\d+)?)"
REFERENCE = re.compile(rf"^(?:{_DOMAIN}/)?{_COMPONENT}(?:/{_COMPONENT})*(?::[\w][\w.-]{{0,127}})?(?:@sha256:[0-9a-f]{{64}})?$")

# What the rehearsal runs of a build; everything else a config holds is named at the start.
EMULATED = {
    "steps": [{"name": fields.ALL, "args": fields.ALL, "entrypoint": fields.ALL, "env": fields.ALL, "dir": fields.ALL,
               "id": fields.ALL, "waitFor": fields.ALL, "timeout": fields.ALL}],
    "images": fields.ALL, "substitutions": fields.ALL, "timeout": fields.ALL,
    "options": {"dynamicSubstitutions": fields.ALL, "substitutionOption": fields.ALL, "env": fields.ALL},
}


class ConfigError(ValueError):
    """Cloud Build refuses the config; str() is one line."""


@dataclasses.dataclass(frozen=True)
class Step:
    index: int
    id: str
    name: str  # the image
    entrypoint: str
    args: tuple[str, ...]
    env: tuple[str, ...]
    dir: str
    wait_for: tuple[str, ...] | None  # None: every earlier step
    timeout: float | None

    @property
    def shown(self) -> str:
        """How Cloud Build's log names the step."""
        return f'Step #{self.index} - "{self.id}"' if self.id else f"Step #{self.index}"

    @property
    def workdir(self) -> str:
        """/workspace, or `dir` under it (an absolute `dir` stands alone; cloud-build-local workdir())."""
        if not self.dir:
            return "/workspace"
        return str(Path(self.dir)) if self.dir.startswith("/") else str(Path("/workspace") / self.dir)


@dataclasses.dataclass(frozen=True)
class Build:
    steps: tuple[Step, ...]
    images: tuple[str, ...]
    timeout: float
    values: dict[str, str]  # every substitution's final value
    warnings: tuple[str, ...]  # what ALLOW_LOOSE let through
    dynamic: bool
    loose: bool


def load(path: str | Path) -> dict:
    """The config as written (YAML or JSON), refused with one line if Cloud Build's `Build`
    message does not take it."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as error:
        raise ConfigError(f"{path}: {error.strerror}") from None
    return load_text(text, str(path))


def load_text(text: str, where: str) -> dict:
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise ConfigError(f"{where}: not valid YAML ({str(error).splitlines()[0]})") from None
    check_schema(document, where)
    return document


def check_schema(document: object, where: str = "the config") -> None:
    from google.cloud.devtools import cloudbuild_v1

    if not isinstance(document, dict):
        raise ConfigError(f"{where}: a build config is a mapping, got {type(document).__name__}")
    try:
        cloudbuild_v1.Build.from_json(json.dumps(document, default=str), ignore_unknown_fields=False)
    except Exception as error:  # proto's ParseError names the field
        raise ConfigError(f"{where}: not a Cloud Build config: {' '.join(str(error).split())}") from None


def duration(text: object, where: str) -> float:
    """A protobuf Duration as a config writes it ("7200s", "1.5s")."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)s", str(text).strip())
    if not match:
        raise ConfigError(f"{where}: invalid timeout value {text!r} (seconds, as 600s)")
    return float(match.group(1))


def not_emulated(document: dict) -> list[str]:
    return fields.not_emulated(document, EMULATED)


def check_steps(document: dict) -> float:
    """cloud-build-local's CheckBuild and CheckBuildSteps on the config as written; returns the
    build's timeout in seconds."""
    timeout = duration(document["timeout"], "timeout") if document.get("timeout") is not None else DEFAULT_TIMEOUT_SECONDS
    if timeout > MAX_TIMEOUT_SECONDS:
        raise ConfigError("timeout exceeds the timeout limit of 24h0m0s")
    steps = document.get("steps") or []
    if not steps:
        raise ConfigError("invalid .steps field: no build steps are specified")
    known = {START}
    for index, step in enumerate(steps):
        label = f"build step #{index}" + (f" - {step['id']!r}" if step.get("id") else "")
        if not step.get("name"):
            raise ConfigError(f"invalid .steps field: build step {index} must specify name")
        for dependency in step.get("waitFor") or []:
            if dependency not in known:
                raise ConfigError(f"invalid .steps field: {label} depends on {dependency!r}, which has not been defined")
        if step.get("id"):
            if step["id"] == START:
                raise ConfigError(f"invalid .steps field: {label}: the ID cannot be {START!r} which is reserved as a "
                                  "dependency for build steps that should run first")
            if step["id"] in known:
                raise ConfigError(f"invalid .steps field: {label}: the ID is not unique")
            known.add(step["id"])
        for entry in step.get("env") or []:
            if "=" not in entry:
                raise ConfigError(f'invalid .steps field: {label}: the Env entry {entry!r} must be of the form "KEY=VALUE"')
        if step.get("timeout") is not None:
            step_timeout = duration(step["timeout"], f"invalid .timeout in {label}")
            if step_timeout > timeout:
                raise ConfigError(f"invalid .timeout in {label}: build step timeout {step_timeout:g}s must be <= build "
                                  f"timeout {timeout:g}s")
    return timeout


def templates(document: dict) -> list[str]:
    """Every field of the build that takes substitutions (cloud-build-local subst.go's list)."""
    found = []
    for step in document.get("steps") or []:
        found += [step.get("name", ""), step.get("entrypoint", ""), step.get("dir", "")]
        found += list(step.get("args") or []) + list(step.get("env") or [])
    found += list(document.get("images") or []) + list(document.get("tags") or [])
    found += list((document.get("options") or {}).get("env") or [])
    found += [document.get("logsBucket", "")]
    artifacts = document.get("artifacts") or {}
    found += list(artifacts.get("images") or []) + list((artifacts.get("objects") or {}).get("paths") or [])
    found += [(artifacts.get("objects") or {}).get("location", "")]
    return [text for text in found if text]


def build_of(document: dict, given: dict[str, str], built_ins: dict[str, str], *, trigger: bool) -> Build:
    """The build Cloud Build would run: checked, substituted. A trigger's build always has dynamic
    substitutions and ALLOW_LOOSE ("Substitute variable values")."""
    timeout = check_steps(document)
    options = document.get("options") or {}
    dynamic = trigger or bool(options.get("dynamicSubstitutions"))
    loose = trigger or options.get("substitutionOption") == "ALLOW_LOOSE"
    defaults = {key: str(value) for key, value in (document.get("substitutions") or {}).items()}
    resolved = subst.resolve(templates(document), defaults, given, built_ins, dynamic=dynamic, loose=loose)

    def sub(text: str) -> str:
        return subst.expand(text, resolved.values, dynamic)

    steps = []
    for index, step in enumerate(document["steps"]):
        name = sub(step["name"])
        if not REFERENCE.match(name):
            raise ConfigError(f"invalid build: build step {index} has an invalid image name {name!r}: "
                              "could not parse reference")
        steps.append(Step(
            index=index, id=step.get("id", ""), name=name, entrypoint=sub(step.get("entrypoint", "")),
            args=tuple(sub(a) for a in step.get("args") or []),
            env=tuple(sub(e) for e in list(options.get("env") or []) + list(step.get("env") or [])),
            dir=sub(step.get("dir", "")),
            wait_for=None if step.get("waitFor") is None else tuple(step["waitFor"]),
            timeout=duration(step["timeout"], "timeout") if step.get("timeout") is not None else None))
    images = tuple(sub(image) for image in document.get("images") or [])
    for image in images:
        if not REFERENCE.match(image):
            raise ConfigError(f"invalid build: invalid image name {image!r}: could not parse reference")
    return Build(tuple(steps), images, timeout, resolved.values, resolved.warnings, dynamic, loose)
