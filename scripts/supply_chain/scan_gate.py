#!/usr/bin/env python3
"""Fails an image build on fixable HIGH and CRITICAL vulnerabilities not on the allowlist, from an On-Demand Scanning result.

    gcloud artifacts docker images list-vulnerabilities SCAN --format=json > vulnerabilities.json
    python3 scripts/supply_chain/scan_gate.py vulnerabilities.json --image tf-runtime-gpu

The input is the JSON list of vulnerability occurrences that `gcloud artifacts docker images
list-vulnerabilities --format=json` prints (On-Demand Scanning API v1 `Occurrence`; its
`vulnerability` is a `VulnerabilityOccurrence`: `severity`, `effectiveSeverity`, `cvssScore`,
`cvssv3`, `cvssV2`, `fixAvailable`, `packageIssue[]`, each `PackageIssue` with `affectedPackage`,
`affectedVersion`, `fixedVersion`, `fixAvailable`, `effectiveSeverity`; Google's reference:
googleapis.dev/ruby/google-apis-ondemandscanning_v1, classes VulnerabilityOccurrence and
PackageIssue).

A finding's severity is the highest of three ratings: the distribution's (`effectiveSeverity`,
which Google describes as "the distro assigned severity ... when it is available"), the note
provider's (`severity`), and the CVSS score's band (CVSS v3.1: 9.0 critical, 7.0 high, 4.0 medium,
0.1 low). A distribution often rates lower than the CVSS score (a CVSS 7.1 finding read MEDIUM in a
real Artifact Registry result), so the distribution's word alone lets HIGH findings through.

A finding blocks when its severity is at or above the threshold (HIGH by default), a fixed version
exists (a fix we have not taken is ours to take: rebuild, refresh the bases or the locks), and no
allowlist entry names its CVE for this image. The allowlist (images/scan-allowlist.toml) holds what
cannot be fixed today, each entry with its CVE, images, reason and review-by date; an entry past its
review-by date fails the gate, whichever image is gated, until someone reviews it.

Exit codes: 0 passed, 1 blocking findings or an expired allowlist entry (each printed on one line),
2 unreadable input, a bad allowlist or a bad threshold (one line on stderr).
"""

from __future__ import annotations

import datetime
import json
import os
import re
import sys
import tomllib
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from trainer import cli  # noqa: E402  (one-line flag errors, as every command of the project)

# Grafeas v1 Severity, lowest first; SEVERITY_UNSPECIFIED ranks below all.
SEVERITIES = ("SEVERITY_UNSPECIFIED", "MINIMAL", "LOW", "MEDIUM", "HIGH", "CRITICAL")
# CVSS v3.1's qualitative bands (FIRST, CVSS v3.1 specification, section 5), highest first.
CVSS_BANDS = ((9.0, "CRITICAL"), (7.0, "HIGH"), (4.0, "MEDIUM"), (0.1, "LOW"))
DEFAULT_ALLOWLIST = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                 "images", "scan-allowlist.toml")
CVE_ID = re.compile(r"^(CVE-\d{4}-\d{4,}|GHSA(-[23456789cfghjmpqrvwx]{4}){3}|PYSEC-\d{4}-\d+)$")
ENTRY_FIELDS = {"cve", "images", "reason", "review_by"}


class ScanInputError(ValueError):
    """str() is one line."""


@dataclass(frozen=True)
class Finding:
    vulnerability: str
    severity: str  # the highest of the three ratings
    package: str
    installed: str
    fixed: str
    ratings: str  # each rating that was given, for the line

    def line(self) -> str:
        return (f"{self.severity} {self.vulnerability} {self.package} {self.installed} -> fixed in {self.fixed}"
                f" ({self.ratings})")


@dataclass(frozen=True)
class AllowEntry:
    cve: str
    images: tuple[str, ...]
    reason: str
    review_by: datetime.date


def severity_rank(name: str) -> int:
    try:
        return SEVERITIES.index(name.upper())
    except ValueError:
        raise ScanInputError(f"unknown severity {name!r}: one of {', '.join(SEVERITIES[1:])}") from None


def _rank(name: object) -> int:
    """A rating's rank; one this script does not know ranks as unspecified."""
    name = str(name or "").upper()
    return SEVERITIES.index(name) if name in SEVERITIES else 0


def cvss_severity(score: float | None) -> str:
    for floor, name in CVSS_BANDS:
        if score is not None and score >= floor:
            return name
    return "SEVERITY_UNSPECIFIED"


def _score(details: dict) -> float | None:
    for value in (details.get("cvssScore"), (details.get("cvssv3") or {}).get("baseScore"),
                  (details.get("cvssV2") or {}).get("baseScore")):
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
            return float(value)
    return None


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
        name = str(occurrence.get("noteName", "")).rsplit("/", 1)[-1] or details.get("shortDescription") or "unnamed"
        score = _score(details)
        issues = details.get("packageIssue") or [{}]
        if not isinstance(issues, list):
            raise ScanInputError(f"occurrence {index}: 'packageIssue' is not a list")
        for issue in issues:
            fixable = issue.get("fixAvailable", details.get("fixAvailable", False))
            # A fixedVersion of kind MAXIMUM means "no fixed version" in Grafeas.
            if not fixable or (issue.get("fixedVersion") or {}).get("kind") == "MAXIMUM":
                continue
            distribution = issue.get("effectiveSeverity") or details.get("effectiveSeverity")
            provider = details.get("severity")
            ratings = [(label, value) for label, value in (("distribution", distribution), ("note", provider),
                                                           ("CVSS", cvss_severity(score)))
                       if _rank(value) > 0]
            severity = max((value.upper() for _, value in ratings), key=_rank, default="SEVERITY_UNSPECIFIED")
            said = ", ".join(f"{label} {value.upper()}" for label, value in ratings if label != "CVSS")
            said = ", ".join(part for part in (said, f"CVSS {score:g}" if score else "") if part) or "unrated"
            found.append(Finding(name, severity, issue.get("affectedPackage") or "?",
                                 _version(issue.get("affectedVersion")), _version(issue.get("fixedVersion")), said))
    return found


def load_allowlist(path: str) -> list[AllowEntry]:
    """The allowlist's entries; any entry missing a field, or malformed, is a ScanInputError."""
    try:
        with open(path, "rb") as allowlist_file:
            document = tomllib.load(allowlist_file)
    except tomllib.TOMLDecodeError as error:
        raise ScanInputError(f"{path}: not valid TOML ({error})") from None
    entries = document.get("allow", [])
    if set(document) - {"allow"} or not isinstance(entries, list):
        raise ScanInputError(f"{path}: expected only [[allow]] tables, got {sorted(document)}")
    loaded = []
    for number, entry in enumerate(entries, 1):
        where = f"{path}: entry {number}"
        missing, unknown = ENTRY_FIELDS - set(entry), set(entry) - ENTRY_FIELDS
        if missing or unknown:
            raise ScanInputError(f"{where}: " + "; ".join(
                part for part in (missing and f"missing {', '.join(sorted(missing))}",
                                  unknown and f"unknown {', '.join(sorted(unknown))}") if part))
        if not isinstance(entry["cve"], str) or not CVE_ID.match(entry["cve"]):
            raise ScanInputError(f"{where}: cve {entry['cve']!r} is not a CVE, GHSA or PYSEC id")
        images = entry["images"]
        if not (isinstance(images, list) and images and all(isinstance(i, str) and i for i in images)):
            raise ScanInputError(f"{where} ({entry['cve']}): images must be a non-empty list of image names")
        if not isinstance(entry["reason"], str) or len(entry["reason"].split()) < 5:
            raise ScanInputError(f"{where} ({entry['cve']}): reason must say why, in a sentence")
        if type(entry["review_by"]) is not datetime.date:
            raise ScanInputError(f"{where} ({entry['cve']}): review_by must be a date (2027-01-31), "
                                 f"got {entry['review_by']!r}")
        loaded.append(AllowEntry(entry["cve"], tuple(images), entry["reason"], entry["review_by"]))
    return loaded


def gate(occurrences: object, image: str, threshold: str, allowlist: list[AllowEntry],
         today: datetime.date) -> tuple[list[Finding], list[tuple[Finding, AllowEntry]], list[AllowEntry]]:
    """(blocking findings, allowed findings with their entry, expired entries), most severe first."""
    floor = severity_rank(threshold)
    expired = [entry for entry in allowlist if entry.review_by < today]
    allowed_for = {entry.cve: entry for entry in allowlist if image in entry.images and entry.review_by >= today}
    at_or_above = sorted({f for f in findings(occurrences) if _rank(f.severity) >= floor},
                         key=lambda f: (-_rank(f.severity), f.vulnerability, f.package))
    blocking = [f for f in at_or_above if f.vulnerability not in allowed_for]
    allowed = [(f, allowed_for[f.vulnerability]) for f in at_or_above if f.vulnerability in allowed_for]
    return blocking, allowed, expired


def main(argv: list[str] | None = None) -> int:
    parser = cli.OneLineParser(prog="scan_gate.py", description=__doc__.split("\n")[0])
    parser.add_argument("scan", help="list-vulnerabilities --format=json output ('-' for stdin)")
    parser.add_argument("--image", required=True, help="the image's name, as the allowlist's entries name it "
                        "(tf-runtime-cpu, tf-runtime-gpu, cassava-trainer-cpu, ...)")
    parser.add_argument("--severity", default="HIGH", help="block fixable findings at or above this (default HIGH)")
    parser.add_argument("--allowlist", default=DEFAULT_ALLOWLIST, help="default images/scan-allowlist.toml")
    parser.add_argument("--today", default=None, help="the date the review-by dates are held to (default today)")
    args = parser.parse_args(argv)
    try:
        today = datetime.date.fromisoformat(args.today) if args.today else datetime.date.today()
    except ValueError:
        print(f"scan_gate.py: error: --today {args.today!r} is not a date (2027-01-31)", file=sys.stderr)
        return 2
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
        allowlist = load_allowlist(args.allowlist)
        blocking, allowed, expired = gate(occurrences, args.image, args.severity, allowlist, today)
    except (ScanInputError, OSError) as error:
        print(f"scan_gate.py: error: {error}", file=sys.stderr)
        return 2
    threshold = args.severity.upper()
    for finding, entry in allowed:
        print(f"allowed until {entry.review_by}: {finding.line()}: {entry.reason}")
    for finding in blocking:
        print(finding.line())
    for entry in expired:
        print(f"expired allowlist entry: {entry.cve} for {', '.join(entry.images)}, review by {entry.review_by}: "
              "review it, then move its date or remove it")
    if blocking or expired:
        print(f"scan_gate.py: {args.image}: {len(blocking)} fixable finding(s) at or above {threshold} not allowlisted, "
              f"{len(expired)} expired allowlist entr{'y' if len(expired) == 1 else 'ies'}: rebuild, refresh the bases "
              "and locks (scripts/supply_chain/refresh_bases.py), or review images/scan-allowlist.toml", file=sys.stderr)
        return 1
    print(f"scan_gate.py: {args.image}: no fixable finding at or above {threshold} outside the allowlist "
          f"({len(occurrences)} occurrence(s) read, {len(allowed)} allowlisted)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
