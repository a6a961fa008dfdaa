#!/usr/bin/env python3
"""Runs a Cloud Build config on this machine the way Cloud Build runs it, before a build costs.

    python scripts/submit_build.py local --config cloudbuild.yaml --substitutions=_REGION=us-central1,_REPOSITORY=trainers .
    python scripts/submit_build.py local --trigger images/triggers/weekly-rebuild.yaml [--branch BRANCH | --sha SHA] [.]

`local` takes `gcloud builds submit`'s own flags (--config, --substitutions, --region, --project,
SOURCE), so the command the README gives for Cloud Build runs here with `gcloud builds submit`
replaced; with --trigger, the build that trigger starts (as `gcloud builds triggers run` would),
from the source's commit. Each step runs as a container of its image (stand-ins for Google's
builder images, named at the start), the images go to a local registry standing in for Artifact
Registry, and the log is Cloud Build's (`Step #N - "id": ...`). The rehearsal is the package
scripts/rehearsal/cloudbuild/ (its __init__ says which module does what); docs/rehearsal.md, "Rehearse
a Cloud Build", has the rules and where each comes from.

Exit codes: 0 the build succeeded; the failing step's exit code; 124 a timeout; 125 the engine could
not run a step; 130 interrupted; 2 a config, substitution or option refused (one line).
Needs podman, buildah, docker-registry (scripts/supply_chain/install_image_tools.sh).
"""

from __future__ import annotations

import argparse
import os
import sys

if not __package__:  # run as a file: the repo root is where `scripts` is found
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from scripts.rehearsal.cloudbuild import build as builds, substitutions as subst  # noqa: E402
from scripts.rehearsal.runner import RehearsalError  # noqa: E402
from trainer import cli  # noqa: E402


def substitutions(text: str) -> dict[str, str]:
    try:
        return subst.parse_flag(text)
    except subst.SubstitutionError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def build_parser() -> argparse.ArgumentParser:
    parser = cli.OneLineParser(prog="scripts/submit_build.py local", description=__doc__.split("\n")[0])
    parser.add_argument("source", nargs="?", default=".", metavar="SOURCE",
                        help="the source folder, uploaded as gcloud uploads it (default .)")
    parser.add_argument("--config", default="cloudbuild.yaml", help="the build config, in SOURCE (default cloudbuild.yaml)")
    parser.add_argument("--substitutions", type=substitutions, default={}, metavar="KEY=VALUE,...",
                        help="as gcloud takes them: user keys start with _, a few trigger-only built-ins may be given")
    parser.add_argument("--trigger", metavar="TRIGGER.yaml",
                        help="run the build this trigger starts (its config, its substitutions, its commit)")
    parser.add_argument("--branch", help="with --trigger: the branch it builds (default the trigger's)")
    parser.add_argument("--sha", help="with --trigger: the commit it builds (default HEAD)")
    parser.add_argument("--project", default=os.environ.get("CLOUDSDK_CORE_PROJECT") or builds.LOCAL_PROJECT,
                        help="PROJECT_ID (default $CLOUDSDK_CORE_PROJECT, else local-project)")
    parser.add_argument("--region", default="global", help="LOCATION (default global, as gcloud's default pool)")
    parser.add_argument("--vulnerabilities", metavar="FILE",
                        help="what the stand-in's On-Demand Scanning finds: a JSON list of occurrences, each for the "
                        "image its resourceUri names (default: nothing found)")
    parser.add_argument("--keep", metavar="DIR",
                        help="keep the registry's storage (DIR/registry, reused by the next build with --keep DIR) and "
                        "the stand-in's records (DIR/standin: scans, SBOM loads)")
    parser.add_argument("--engine", choices=("podman",), default=None, help="the container engine (podman)")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] != ["local"]:
        print("submit_build: error: the one verb is `local` (run the build here; `gcloud builds submit` runs it on "
              "Cloud Build)", file=sys.stderr)
        return 2
    args = build_parser().parse_args(argv[1:])
    if (args.branch or args.sha) and not args.trigger:
        print("submit_build: error: --branch and --sha are for --trigger", file=sys.stderr)
        return 2
    options = builds.Options(config=args.config, source=args.source, substitutions=tuple(args.substitutions.items()),
                             trigger=args.trigger, branch=args.branch, sha=args.sha, project=args.project,
                             region=args.region, vulnerabilities=args.vulnerabilities, keep=args.keep,
                             engine=args.engine)
    try:
        return builds.run_build(options)
    except RehearsalError as error:
        print(f"submit_build: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
