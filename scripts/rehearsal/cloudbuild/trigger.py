"""A build trigger (a BuildTrigger as `gcloud builds triggers import` takes it, such as
images/triggers/weekly-rebuild.yaml) turned into the build it starts: its config file, its
substitutions, and the trigger-only built-ins ("Substitute variable values": TRIGGER_NAME,
COMMIT_SHA, REVISION_ID, SHORT_SHA, REPO_NAME, REPO_FULL_NAME, BRANCH_NAME, TAG_NAME, REF_NAME,
TRIGGER_BUILD_CONFIG_PATH, SERVICE_ACCOUNT_EMAIL, SERVICE_ACCOUNT). Pure functions; the commit comes
from the caller (git, at the edge)."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import yaml

from scripts.rehearsal.cloudbuild.config import ConfigError


@dataclasses.dataclass(frozen=True)
class Trigger:
    name: str
    config_path: str  # the build config, relative to the repository
    substitutions: dict[str, str]
    ref: str  # refs/heads/BRANCH or refs/tags/TAG
    repository: str  # the repository's URI
    service_account: str


def load(path: str | Path) -> Trigger:
    """The trigger, refused with one line if Cloud Build's `BuildTrigger` message does not take it
    or it runs no config file of the repository."""
    from google.cloud.devtools import cloudbuild_v1

    path = Path(path)
    try:
        document = yaml.safe_load(path.read_text())
        cloudbuild_v1.BuildTrigger.from_json(json.dumps(document), ignore_unknown_fields=False)
    except OSError as error:
        raise ConfigError(f"--trigger {path}: {error.strerror}") from None
    except Exception as error:
        raise ConfigError(f"--trigger {path}: not a Cloud Build trigger: {' '.join(str(error).split())}") from None
    source = document.get("gitFileSource") or {}
    if not source.get("path"):
        raise ConfigError(f"--trigger {path}: the trigger names no build config (gitFileSource.path); "
                          "an inline build or a Dockerfile trigger is not rehearsed")
    to_build = document.get("sourceToBuild") or {}
    return Trigger(name=document.get("name", ""), config_path=source["path"],
                   substitutions={k: str(v) for k, v in (document.get("substitutions") or {}).items()},
                   ref=to_build.get("ref") or source.get("revision") or "", repository=to_build.get("uri", ""),
                   service_account=document.get("serviceAccount", ""))


def built_ins(trigger: Trigger, commit_sha: str, ref: str | None = None) -> dict[str, str]:
    """The trigger-only substitutions of a build of `commit_sha`, on the trigger's ref (or `ref`)."""
    ref = ref or trigger.ref
    branch = ref[len("refs/heads/"):] if ref.startswith("refs/heads/") else ""
    tag = ref[len("refs/tags/"):] if ref.startswith("refs/tags/") else ""
    match = re.search(r"([^/:]+)/([^/]+?)(?:\.git)?/?$", trigger.repository)
    owner, repo = (match.group(1), match.group(2)) if match else ("", "")
    email = trigger.service_account.rsplit("/", 1)[-1] if trigger.service_account else ""
    return {"TRIGGER_NAME": trigger.name, "COMMIT_SHA": commit_sha, "REVISION_ID": commit_sha,
            "SHORT_SHA": commit_sha[:7], "REPO_NAME": repo, "REPO_FULL_NAME": f"{owner}/{repo}" if repo else "",
            "BRANCH_NAME": branch, "TAG_NAME": tag, "REF_NAME": branch or tag,
            "TRIGGER_BUILD_CONFIG_PATH": trigger.config_path, "SERVICE_ACCOUNT_EMAIL": email,
            "SERVICE_ACCOUNT": trigger.service_account}
