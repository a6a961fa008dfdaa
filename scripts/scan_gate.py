#!/usr/bin/env python3
"""Fails an image build on fixable vulnerabilities at or above a severity, from an On-Demand Scanning result.

    gcloud artifacts docker images list-vulnerabilities SCAN --format=json > vulnerabilities.json
    python3 scripts/scan_gate.py --severity CRITICAL vulnerabilities.json

The input is the JSON list of Grafeas vulnerability occurrences that `gcloud artifacts docker images
list-vulnerabilities --format=json` prints (On-Demand Scanning API v1, `Occurrence` with a
`vulnerability` field: `effectiveSeverity`, `fixAvailable`, `packageIssue[]`). A finding fails the
gate when its severity is at or above the threshold and a fixed version exists: a fix we have not
taken is ours to take (rebuild, refresh the bases or the locks); one nobody has published yet
cannot be fixed by rebuilding, and blocking on it would block every build until upstream acts.

Exit codes: 0 passed, 1 fixable findings at or above the threshold (each printed on one line),
2 unreadable input or a bad threshold (one line on stderr).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass

# Grafeas v1 Severity, lowest first; SEVERITY_UNSPECIFIED ranks below all.
SEVERITIES = ("SEVERITY_UNSPECIFIED", "MINIMAL", "LOW", "MEDIUM", "HIGH", "CRITICAL")


class ScanInputError(ValueError):
    """str() is one line."""


@dataclass(frozen=True)
class Finding:
    vulnerability: str
    severity: str
    package: str
    installed: str
    fixed: str

    def line(self) -> str:
        return f"{self.severity} {self.vulnerability} {self.package} {self.installed} -> fixed in {self.fixed}"


def severity_rank(name: str) -> int:
    try:
        return SEVERITIES.index(name.upper())
    except ValueError:
        raise ScanInputError(f"unknown severity {name!r}: one of {', '.join(SEVERITIES[1:])}") from None


def _version(version: dict | None) -> str:
    version = version or {}
    return version.get("fullName") or version.get("name") or "?"


def findings(occurrences: object) -> list[Finding]:
    """Every fixable package issue in a list-vulnerabilities result, one Finding each."""
    if not isinstance(occurrences, list):
        raise ScanInputError(f"expected a JSON list of occurrences, got {type(occurrences).__name__}")
    found = []
    for index, occurrence in enumerate(occurrences):
        details = occurrence.get("vulnerability") if isinstance(occurrence, dict) else None
        if not isinstance(details, dict):
            raise ScanInputError(f"occurrence {index} has no 'vulnerability' object")
        name = str(occurrence.get("noteName", "")).rsplit("/", 1)[-1] or "unnamed"
        severity = details.get("effectiveSeverity") or details.get("severity") or "SEVERITY_UNSPECIFIED"
        issues = details.get("packageIssue") or [{}]
        for issue in issues:
            fixable = issue.get("fixAvailable", details.get("fixAvailable", False))
            # A fixedVersion of kind MAXIMUM means "no fixed version" in Grafeas.
            if not fixable or (issue.get("fixedVersion") or {}).get("kind") == "MAXIMUM":
                continue
            found.append(Finding(name, issue.get("effectiveSeverity") or severity,
                                 issue.get("affectedPackage") or "?", _version(issue.get("affectedVersion")),
                                 _version(issue.get("fixedVersion"))))
    return found


def failing(occurrences: object, threshold: str) -> list[Finding]:
    """The fixable findings at or above `threshold`, most severe first."""
    floor = severity_rank(threshold)

    def rank(finding: Finding) -> int:  # a severity this script does not know ranks as unspecified
        name = finding.severity.upper()
        return SEVERITIES.index(name) if name in SEVERITIES else 0

    at_or_above = {f for f in findings(occurrences) if rank(f) >= floor}
    return sorted(at_or_above, key=lambda f: (-rank(f), f.vulnerability, f.package))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scan_gate.py", description=__doc__.split("\n")[0])
    parser.add_argument("scan", help="list-vulnerabilities --format=json output ('-' for stdin)")
    parser.add_argument("--severity", default="CRITICAL",
                        help="fail on fixable findings at or above this (default CRITICAL)")
    args = parser.parse_args(argv)
    try:
        if args.scan == "-":
            text = sys.stdin.read()
        else:
            with open(args.scan) as scan_file:
                text = scan_file.read()
        try:
            occurrences = json.loads(text)
        except json.JSONDecodeError as error:
            raise ScanInputError(f"{args.scan}: not valid JSON ({error.msg} at line {error.lineno})") from None
        blocking = failing(occurrences, args.severity)
    except (ScanInputError, OSError) as error:
        print(f"scan_gate.py: error: {error}", file=sys.stderr)
        return 2
    if blocking:
        for finding in blocking:
            print(finding.line())
        print(f"scan_gate.py: {len(blocking)} fixable finding(s) at or above {args.severity.upper()}: "
              "rebuild, or refresh the bases and locks (scripts/refresh_bases.py)", file=sys.stderr)
        return 1
    print(f"scan_gate.py: no fixable finding at or above {args.severity.upper()} "
          f"({len(occurrences)} occurrence(s) read)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
