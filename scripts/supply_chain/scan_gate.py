#!/usr/bin/env python3
"""Fails an image build on HIGH and CRITICAL vulnerabilities that no allowlist entry covers, from an On-Demand Scanning result.

    gcloud artifacts docker images list-vulnerabilities SCAN --format=json > vulnerabilities.json
    python3 scripts/supply_chain/scan_gate.py vulnerabilities.json --image tf-runtime-gpu
    python3 scripts/supply_chain/scan_gate.py --check-only --policy weekly --severity HIGH

The input is the JSON list of vulnerability occurrences that `gcloud artifacts docker images
list-vulnerabilities --format=json` prints (On-Demand Scanning API v1 `Occurrence`; its
`vulnerability` is a `VulnerabilityOccurrence`: `severity`, `effectiveSeverity`, `cvssScore`,
`cvssv3`, `cvssV2`, `fixAvailable`, `packageIssue[]`, each `PackageIssue` with `affectedPackage`,
`affectedVersion`, `fixedVersion`, `fixAvailable`, `effectiveSeverity`; Google's reference:
googleapis.dev/ruby/google-apis-ondemandscanning_v1, classes VulnerabilityOccurrence and
PackageIssue).

The rules, as AWS's Deep Learning Containers run their gate (aws/deep-learning-containers,
test/security and docs/security/cve-patching-sla.md):
- a finding's severity is the highest of three ratings: the distribution's (`effectiveSeverity`,
  "the distro assigned severity ... when it is available"), the note provider's (`severity`), and
  the band of its CVSS score (CVSS v3.1: 9.0 critical, 7.0 high, 4.0 medium, 0.1 low). Its CVSS
  score is the highest one the occurrence gives (`cvssScore`, `cvssv3.baseScore`,
  `cvssV2.baseScore`): a distribution often rates lower than the score (a CVSS 7.1 finding read
  MEDIUM in a real Artifact Registry result), and the scores themselves can disagree;
- every finding at or above the threshold (HIGH by default) fails the build unless an allowlist
  entry covers it, with a fix published or not: one with a fix is ours to take (rebuild, refresh
  the bases or the locks), one without is printed in the build log and must be accepted, with a
  reason, by an allowlist entry, never passed in silence;
- an allowlist entry (images/scan-allowlist.toml) covers one CVE in one package, in every image
  that carries that package: its CVE, its package, a reason and a review-by date at most 90 days
  ahead. An entry past its review-by date fails every build until someone reviews it;
- `--policy weekly` (the scheduled rebuild) gates at HIGH and nothing else: a lower threshold
  fails every week on findings nobody can fix and so ships no fix at all, a higher one lets HIGH
  findings past their 28-day deadline (docs/images.md#support-policy).

`--check-only` checks the allowlist and the policy alone, before anything is built.

Exit codes: 0 passed, 1 findings no entry covers or an expired allowlist entry (each printed on
one line), 2 unreadable input, a bad allowlist, a bad threshold or a threshold the policy refuses
(one line on stderr).
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
ENTRY_FIELDS = {"cve", "package", "reason", "review_by"}
# How far ahead a review-by date may be: an exception is looked at again within a quarter.
MAX_REVIEW_DAYS = 90
POLICIES = ("build", "weekly")
WEEKLY_SEVERITY = "HIGH"


class ScanInputError(ValueError):
    """str() is one line."""


@dataclass(frozen=True)
class Finding:
    vulnerability: str
    severity: str  # the highest of the three ratings
    package: str
    installed: str
    fixed: str | None  # None: no fixed version is published
    ratings: str  # each rating that was given, for the line

    def line(self) -> str:
        fix = f"fixed in {self.fixed}" if self.fixed else "no fix published"
        return f"{self.severity} {self.vulnerability} {self.package} {self.installed} -> {fix} ({self.ratings})"


@dataclass(frozen=True)
class AllowEntry:
    cve: str
    package: str
    reason: str
    review_by: datetime.date


@dataclass(frozen=True)
class Verdict:
    """What the gate decided, most severe first in each list."""

    blocking: tuple[Finding, ...]
    allowed: tuple[tuple[Finding, AllowEntry], ...]
    expired: tuple[AllowEntry, ...]

    @property
    def passed(self) -> bool:
        return not self.blocking and not self.expired


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


def cvss_score(details: dict) -> float | None:
    """The highest CVSS score the occurrence gives; None when it gives none."""
    scores = [value for value in (details.get("cvssScore"), (details.get("cvssv3") or {}).get("baseScore"),
                                  (details.get("cvssV2") or {}).get("baseScore"))
              if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0]
    return float(max(scores)) if scores else None


def _version(version: dict | None) -> str:
    version = version or {}
    return version.get("fullName") or version.get("name") or "?"


def package_name(name: str) -> str:
    """A package's name as the allowlist compares it: PyPI's normalised form (PEP 503), which
    leaves a Debian or Ubuntu package's name as it is."""
    return re.sub(r"[-_.]+", "-", name).lower()


def findings(occurrences: object) -> list[Finding]:
    """Every package issue in a list-vulnerabilities result, one Finding each."""
    if not isinstance(occurrences, list):
        raise ScanInputError(f"expected a JSON list of occurrences, got {type(occurrences).__name__}")
    found = []
    for index, occurrence in enumerate(occurrences):
        details = occurrence.get("vulnerability") if isinstance(occurrence, dict) else None
        if not isinstance(details, dict):
            raise ScanInputError(f"occurrence {index} has no 'vulnerability' object")
        name = str(occurrence.get("noteName", "")).rsplit("/", 1)[-1] or details.get("shortDescription") or "unnamed"
        score = cvss_score(details)
        issues = details.get("packageIssue") or [{}]
        if not isinstance(issues, list):
            raise ScanInputError(f"occurrence {index}: 'packageIssue' is not a list")
        for issue in issues:
            # A fixedVersion of kind MAXIMUM means "no fixed version" in Grafeas.
            fixable = (issue.get("fixAvailable", details.get("fixAvailable", False))
                       and (issue.get("fixedVersion") or {}).get("kind") != "MAXIMUM")
            distribution = issue.get("effectiveSeverity") or details.get("effectiveSeverity")
            provider = details.get("severity")
            ratings = [(label, value) for label, value in (("distribution", distribution), ("note", provider),
                                                           ("CVSS", cvss_severity(score)))
                       if _rank(value) > 0]
            severity = max((value.upper() for _, value in ratings), key=_rank, default="SEVERITY_UNSPECIFIED")
            said = ", ".join(f"{label} {value.upper()}" for label, value in ratings if label != "CVSS")
            said = ", ".join(part for part in (said, f"CVSS {score:g}" if score else "") if part) or "unrated"
            found.append(Finding(name, severity, issue.get("affectedPackage") or "?",
                                 _version(issue.get("affectedVersion")),
                                 _version(issue.get("fixedVersion")) if fixable else None, said))
    return found


def load_allowlist(path: str, today: datetime.date) -> list[AllowEntry]:
    """The allowlist's entries; any entry missing a field, malformed, repeated, or with a review-by
    date more than MAX_REVIEW_DAYS after `today`, is a ScanInputError."""
    try:
        with open(path, "rb") as allowlist_file:
            document = tomllib.load(allowlist_file)
    except tomllib.TOMLDecodeError as error:
        raise ScanInputError(f"{path}: not valid TOML ({error})") from None
    entries = document.get("allow", [])
    if set(document) - {"allow"} or not isinstance(entries, list):
        raise ScanInputError(f"{path}: expected only [[allow]] tables, got {sorted(document)}")
    loaded, seen = [], set()
    latest = today + datetime.timedelta(days=MAX_REVIEW_DAYS)
    for number, entry in enumerate(entries, 1):
        where = f"{path}: entry {number}"
        missing, unknown = ENTRY_FIELDS - set(entry), set(entry) - ENTRY_FIELDS
        if missing or unknown:
            hint = " (entries name a package, not images: one entry per CVE and package)" if "images" in unknown else ""
            raise ScanInputError(f"{where}: " + "; ".join(
                part for part in (missing and f"missing {', '.join(sorted(missing))}",
                                  unknown and f"unknown {', '.join(sorted(unknown))}") if part) + hint)
        if not isinstance(entry["cve"], str) or not CVE_ID.match(entry["cve"]):
            raise ScanInputError(f"{where}: cve {entry['cve']!r} is not a CVE, GHSA or PYSEC id")
        where = f"{where} ({entry['cve']})"
        if not isinstance(entry["package"], str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._+-]*", entry["package"]):
            raise ScanInputError(f"{where}: package must be one package's name, as the scan names it, "
                                 f"got {entry['package']!r}")
        if not isinstance(entry["reason"], str) or len(entry["reason"].split()) < 5:
            raise ScanInputError(f"{where}: reason must say why, in a sentence")
        if type(entry["review_by"]) is not datetime.date:
            raise ScanInputError(f"{where}: review_by must be a date (2027-01-31), got {entry['review_by']!r}")
        if entry["review_by"] > latest:
            raise ScanInputError(f"{where}: review_by {entry['review_by']} is more than {MAX_REVIEW_DAYS} days after "
                                 f"{today}: review it by {latest} at the latest")
        key = (entry["cve"], package_name(entry["package"]))
        if key in seen:
            raise ScanInputError(f"{where}: a second entry for {entry['cve']} in {entry['package']}")
        seen.add(key)
        loaded.append(AllowEntry(entry["cve"], entry["package"], entry["reason"], entry["review_by"]))
    return loaded


def check_policy(policy: str, threshold: str) -> None:
    """Raises ScanInputError when the policy refuses the threshold."""
    severity_rank(threshold)
    if policy not in POLICIES:
        raise ScanInputError(f"unknown policy {policy!r}: one of {', '.join(POLICIES)}")
    if policy == "weekly" and threshold.upper() != WEEKLY_SEVERITY:
        lower = severity_rank(threshold) < severity_rank(WEEKLY_SEVERITY)
        raise ScanInputError(
            f"the weekly rebuild gates at {WEEKLY_SEVERITY}, not {threshold.upper()}: "
            + ("a lower threshold fails every week on findings nobody can fix, and then no fix ships"
               if lower else "a higher one lets HIGH findings past their 28-day deadline")
            + " (docs/images.md#support-policy)")


def gate(occurrences: object, threshold: str, allowlist: list[AllowEntry], today: datetime.date) -> Verdict:
    floor = severity_rank(threshold)
    expired = tuple(entry for entry in allowlist if entry.review_by < today)
    allowed_for = {(entry.cve, package_name(entry.package)): entry for entry in allowlist if entry.review_by >= today}
    at_or_above = sorted({f for f in findings(occurrences) if _rank(f.severity) >= floor},
                         key=lambda f: (-_rank(f.severity), f.fixed is None, f.vulnerability, f.package))
    covering = {f: allowed_for.get((f.vulnerability, package_name(f.package))) for f in at_or_above}
    return Verdict(blocking=tuple(f for f in at_or_above if covering[f] is None),
                   allowed=tuple((f, covering[f]) for f in at_or_above if covering[f] is not None),
                   expired=expired)


def _read_scan(path: str) -> object:
    if path == "-":
        text = sys.stdin.read()
    else:
        with open(path) as scan_file:
            text = scan_file.read()
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise ScanInputError(f"{path}: not valid JSON ({error.msg} at line {error.lineno})") from None


def _print_expired(expired) -> None:
    for entry in expired:
        print(f"expired allowlist entry: {entry.cve} in {entry.package}, review by {entry.review_by}: "
              "review it, then move its date or remove it")


def main(argv: list[str] | None = None) -> int:
    parser = cli.OneLineParser(prog="scan_gate.py", description=__doc__.split("\n")[0])
    parser.add_argument("scan", nargs="?", help="list-vulnerabilities --format=json output ('-' for stdin)")
    parser.add_argument("--image", help="the image's name, for the lines it prints (tf-runtime-cpu, ...)")
    parser.add_argument("--severity", default="HIGH", help="block findings at or above this (default HIGH)")
    parser.add_argument("--policy", default="build", help="build (default) or weekly: the scheduled rebuild, which "
                        "gates at HIGH only")
    parser.add_argument("--check-only", action="store_true", help="check the allowlist and the policy, read no scan")
    parser.add_argument("--allowlist", default=DEFAULT_ALLOWLIST, help="default images/scan-allowlist.toml")
    parser.add_argument("--today", default=None, help="the date the review-by dates are held to (default today, UTC)")
    args = parser.parse_args(argv)
    if args.check_only == bool(args.scan):
        parser.error("give a scan result (and --image), or --check-only")
    if args.scan and not args.image:
        parser.error("--image names the image the scan is of")
    try:
        today = (datetime.date.fromisoformat(args.today) if args.today
                 else datetime.datetime.now(datetime.timezone.utc).date())
    except ValueError:
        print(f"scan_gate.py: error: --today {args.today!r} is not a date (2027-01-31)", file=sys.stderr)
        return 2
    threshold = args.severity.upper()
    try:
        check_policy(args.policy, threshold)
        allowlist = load_allowlist(args.allowlist, today)
        if args.check_only:
            verdict = Verdict((), (), tuple(entry for entry in allowlist if entry.review_by < today))
        else:
            occurrences = _read_scan(args.scan)
            verdict = gate(occurrences, threshold, allowlist, today)
    except (ScanInputError, OSError) as error:
        print(f"scan_gate.py: error: {error}", file=sys.stderr)
        return 2
    if args.check_only:
        _print_expired(verdict.expired)
        if verdict.expired:
            print(f"scan_gate.py: {len(verdict.expired)} expired allowlist entr{'y' if len(verdict.expired) == 1 else 'ies'}"
                  ": review images/scan-allowlist.toml", file=sys.stderr)
            return 1
        print(f"scan_gate.py: policy {args.policy} at {threshold}; {len(allowlist)} allowlist entr"
              f"{'y' if len(allowlist) == 1 else 'ies'}, none past its review-by date")
        return 0
    for finding, entry in verdict.allowed:
        print(f"allowed until {entry.review_by}: {finding.line()}: {entry.reason}")
    for finding in verdict.blocking:
        print(finding.line())
    _print_expired(verdict.expired)
    if not verdict.passed:
        fixable = sum(1 for f in verdict.blocking if f.fixed)
        print(f"scan_gate.py: {args.image}: {len(verdict.blocking)} finding(s) at or above {threshold} that no allowlist "
              f"entry covers ({fixable} with a fix, {len(verdict.blocking) - fixable} with none published), "
              f"{len(verdict.expired)} expired allowlist entr{'y' if len(verdict.expired) == 1 else 'ies'}: rebuild, "
              "refresh the bases and locks (scripts/supply_chain/refresh_bases.py), or review "
              "images/scan-allowlist.toml", file=sys.stderr)
        return 1
    print(f"scan_gate.py: {args.image}: no finding at or above {threshold} outside the allowlist "
          f"({len(occurrences)} occurrence(s) read, {len(verdict.allowed)} allowlisted)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
