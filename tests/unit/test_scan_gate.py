"""scripts/scan_gate.py on canned On-Demand Scanning results (no scan can run here): it fails the
build on a fixable finding at or above the threshold and on nothing else."""

import json
import subprocess
import sys

import pytest

from helpers import REPO
from scripts import scan_gate


def occurrence(cve, severity, package="openssl", installed="3.5.1-1", fixed="3.5.1-1+deb13u1", fix_available=True):
    """One occurrence as `gcloud artifacts docker images list-vulnerabilities --format=json` prints it."""
    fixed_version = ({"name": fixed.split("-")[0], "revision": fixed.partition("-")[2], "kind": "NORMAL",
                      "fullName": fixed} if fix_available else {"kind": "MAXIMUM"})
    return {
        "name": f"projects/p/locations/us/scans/s/occurrences/{cve}",
        "kind": "VULNERABILITY",
        "noteName": f"projects/goog-vulnz/notes/{cve}",
        "resourceUri": "us-central1-docker.pkg.dev/p/trainers/cassava-trainer-cpu:abc123",
        "vulnerability": {
            "severity": severity, "effectiveSeverity": severity, "cvssScore": 9.8, "fixAvailable": fix_available,
            "packageIssue": [{
                "affectedCpeUri": "cpe:/o:debian:debian_linux:13", "affectedPackage": package,
                "affectedVersion": {"name": installed.split("-")[0], "revision": installed.partition("-")[2],
                                    "kind": "NORMAL", "fullName": installed},
                "fixedVersion": fixed_version, "fixAvailable": fix_available, "packageType": "OS",
                "effectiveSeverity": severity,
            }],
            "shortDescription": cve,
        },
    }


def run_gate(tmp_path, scan, *args):
    path = tmp_path / "vulnerabilities.json"
    path.write_text(scan if isinstance(scan, str) else json.dumps(scan))
    return subprocess.run([sys.executable, str(REPO / "scripts" / "scan_gate.py"), str(path), *args],
                          capture_output=True, text=True)


def test_a_fixable_critical_finding_fails_the_build_and_is_printed(tmp_path):
    scan = [occurrence("CVE-2026-0001", "CRITICAL"), occurrence("CVE-2026-0002", "LOW", package="gzip")]
    result = run_gate(tmp_path, scan)
    assert result.returncode == 1
    assert result.stdout.splitlines() == ["CRITICAL CVE-2026-0001 openssl 3.5.1-1 -> fixed in 3.5.1-1+deb13u1"]
    assert "1 fixable finding(s) at or above CRITICAL" in result.stderr


def test_an_unfixable_critical_finding_passes(tmp_path):
    result = run_gate(tmp_path, [occurrence("CVE-2026-0003", "CRITICAL", fix_available=False)])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no fixable finding at or above CRITICAL (1 occurrence(s) read)" in result.stdout


def test_findings_below_the_threshold_pass_and_a_lower_threshold_catches_them(tmp_path):
    scan = [occurrence("CVE-2026-0004", "HIGH"), occurrence("CVE-2026-0005", "MEDIUM", package="perl-base")]
    assert run_gate(tmp_path, scan).returncode == 0
    result = run_gate(tmp_path, scan, "--severity", "high")
    assert result.returncode == 1
    assert result.stdout.splitlines() == ["HIGH CVE-2026-0004 openssl 3.5.1-1 -> fixed in 3.5.1-1+deb13u1"]


def test_an_empty_scan_passes(tmp_path):
    assert run_gate(tmp_path, []).returncode == 0


@pytest.mark.parametrize("scan, message", [
    ("{not json", "not valid JSON"),
    ('{"vulnerability": {}}', "expected a JSON list of occurrences, got dict"),
    ('[{"kind": "VULNERABILITY"}]', "occurrence 0 has no 'vulnerability' object"),
])
def test_bad_input_is_one_line_and_exit_code_2(tmp_path, scan, message):
    result = run_gate(tmp_path, scan)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and message in result.stderr, result.stderr
    assert result.stdout == ""


def test_an_unknown_threshold_is_one_line_and_exit_code_2(tmp_path):
    result = run_gate(tmp_path, [], "--severity", "SEVERE")
    assert result.returncode == 2
    assert result.stderr.strip() == ("scan_gate.py: error: unknown severity 'SEVERE': one of "
                                     "MINIMAL, LOW, MEDIUM, HIGH, CRITICAL")


def test_a_fixed_version_of_kind_maximum_means_no_fix():
    finding = occurrence("CVE-2026-0006", "CRITICAL")
    finding["vulnerability"]["packageIssue"][0]["fixedVersion"] = {"kind": "MAXIMUM"}
    assert scan_gate.failing([finding], "CRITICAL") == []
