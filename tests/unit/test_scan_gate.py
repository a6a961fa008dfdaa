"""scripts/supply_chain/scan_gate.py on canned On-Demand Scanning results (no scan can run here).

The canned occurrences have exactly the fields of On-Demand Scanning API v1's `Occurrence` and
`VulnerabilityOccurrence` (Google's reference, googleapis.dev/ruby/google-apis-ondemandscanning_v1:
`cvssScore`, `cvssv3`, `cvssV2`, `cvssVersion`, `severity`, `effectiveSeverity`, `fixAvailable`,
`packageIssue[]` of `PackageIssue`: `affectedCpeUri`, `affectedPackage`, `affectedVersion`,
`fixedCpeUri`, `fixedPackage`, `fixedVersion`, `fixAvailable`, `packageType`, `effectiveSeverity`),
laid out as a real Artifact Registry answer is (the one in influxdata/sedg's tests/test_gar.py: a
CVSS 7.1 ncurses finding whose distribution rating is MEDIUM). Every canned occurrence is parsed
into Grafeas v1's own `Occurrence` message with unknown fields refused, so a misspelt or invented
field fails the test rather than pass silently.
"""

import copy
import datetime
import json
import subprocess
import sys

import pytest

from helpers import REPO
from scripts.supply_chain import scan_gate

TODAY = "2026-11-26"
ALLOWLIST = REPO / "images" / "scan-allowlist.toml"


def occurrence(cve, *, cvss=7.1, distribution="MEDIUM", provider="HIGH", package="ncurses",
               installed=("6.5+20250216", "2"), fixed=("6.5+20250216", "2+deb13u1"), fix_available=True,
               package_type="OS"):
    """One occurrence, as `gcloud artifacts docker images list-vulnerabilities --format=json` prints it."""
    def version(name, revision):
        if not revision:  # a Python package's version has no distribution revision
            return {"name": name, "kind": "NORMAL", "fullName": name}
        return {"name": name, "revision": revision, "kind": "NORMAL", "fullName": f"{name}-{revision}"}

    return {
        "name": f"projects/p/locations/us/scans/3f2b/occurrences/{cve.lower()}",
        "resourceUri": "us-central1-docker.pkg.dev/p/trainers/tf-runtime-cpu@sha256:" + "0" * 64,
        "noteName": f"projects/goog-vulnz/notes/{cve}",
        "kind": "VULNERABILITY",
        "createTime": "2026-11-26T09:14:03.481201Z",
        "updateTime": "2026-11-26T09:14:03.481201Z",
        "vulnerability": {
            "severity": provider,
            "cvssScore": cvss,
            "packageIssue": [{
                "affectedCpeUri": "cpe:/o:debian:debian_linux:13",
                "affectedPackage": package,
                "affectedVersion": version(*installed),
                "fixedCpeUri": "cpe:/o:debian:debian_linux:13",
                "fixedPackage": package,
                "fixedVersion": version(*fixed) if fix_available else {"kind": "MAXIMUM"},
                "fixAvailable": fix_available,
                "packageType": package_type,
                "effectiveSeverity": distribution,
            }],
            "shortDescription": cve,
            "longDescription": "NIST vectors: CVSS:3.1/AV:L/AC:L/PR:N/UI:R/S:U/C:H/I:N/A:H",
            "relatedUrls": [{"url": f"https://security-tracker.debian.org/tracker/{cve}", "label": "More Info"}],
            "effectiveSeverity": distribution,
            "fixAvailable": fix_available,
            "cvssv3": {"baseScore": cvss, "exploitabilityScore": 1.8, "impactScore": 5.2,
                       "attackVector": "ATTACK_VECTOR_LOCAL", "attackComplexity": "ATTACK_COMPLEXITY_LOW",
                       "privilegesRequired": "PRIVILEGES_REQUIRED_NONE", "userInteraction": "USER_INTERACTION_REQUIRED",
                       "scope": "SCOPE_UNCHANGED", "confidentialityImpact": "IMPACT_HIGH",
                       "integrityImpact": "IMPACT_NONE", "availabilityImpact": "IMPACT_HIGH"},
            "cvssVersion": "CVSS_VERSION_3",
        },
    }


def cuda(cve):
    return occurrence(cve, cvss=7.8, distribution="HIGH", provider="HIGH", package="nvidia-cuda-nvcc-cu12",
                      installed=("12.9.86", ""), fixed=("13.0.48", ""), package_type="PYPI")


def run_gate(tmp_path, scan, *args, image="tf-runtime-cpu", allowlist=ALLOWLIST, today=TODAY):
    path = tmp_path / "vulnerabilities.json"
    path.write_text(scan if isinstance(scan, str) else json.dumps(scan))
    command = [sys.executable, str(REPO / "scripts" / "supply_chain" / "scan_gate.py"), str(path), "--image", image,
               "--allowlist", str(allowlist), *(["--today", today] if today else []), *args]
    return subprocess.run(command, capture_output=True, text=True)


@pytest.mark.parametrize("canned", [occurrence("CVE-2026-0001"), cuda("CVE-2025-23308"),
                                    occurrence("CVE-2026-0003", fix_available=False)])
def test_the_canned_answers_are_grafeas_occurrences_field_for_field(canned):
    from grafeas.grafeas_v1 import Occurrence

    parsed = Occurrence.from_json(json.dumps(canned), ignore_unknown_fields=False)
    assert parsed.vulnerability.cvss_score == pytest.approx(canned["vulnerability"]["cvssScore"])
    assert parsed.vulnerability.package_issue[0].affected_package == canned["vulnerability"]["packageIssue"][0]["affectedPackage"]
    misspelt = copy.deepcopy(canned)
    misspelt["vulnerability"]["cvssV3"] = misspelt["vulnerability"].pop("cvssv3")  # the reference says cvssv3
    with pytest.raises(Exception, match="cvssV3"):
        Occurrence.from_json(json.dumps(misspelt), ignore_unknown_fields=False)


def test_a_fixable_high_cvss_finding_the_distribution_rates_medium_blocks_by_default(tmp_path):
    result = run_gate(tmp_path, [occurrence("CVE-2026-0001"), occurrence("CVE-2026-0002", cvss=3.3, distribution="LOW",
                                                                         provider="LOW", package="gzip")])
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stdout.splitlines() == [
        "HIGH CVE-2026-0001 ncurses 6.5+20250216-2 -> fixed in 6.5+20250216-2+deb13u1 "
        "(distribution MEDIUM, note HIGH, CVSS 7.1)"]
    assert "tf-runtime-cpu: 1 fixable finding(s) at or above HIGH not allowlisted" in result.stderr


def test_the_cvss_score_alone_raises_a_finding_every_rating_puts_lower():
    finding, = scan_gate.findings([occurrence("CVE-2026-0010", cvss=9.8, distribution="LOW", provider="MEDIUM")])
    assert finding.severity == "CRITICAL"
    no_score = occurrence("CVE-2026-0011", cvss=0, distribution="LOW", provider="LOW")
    del no_score["vulnerability"]["cvssScore"], no_score["vulnerability"]["cvssv3"]
    assert scan_gate.findings([no_score])[0].severity == "LOW"


def test_the_threshold_can_be_raised_to_critical_only(tmp_path):
    scan = [occurrence("CVE-2026-0004"), occurrence("CVE-2026-0005", cvss=9.1, package="perl-base")]
    result = run_gate(tmp_path, scan, "--severity", "critical")
    assert result.returncode == 1
    assert [line.split()[:2] for line in result.stdout.splitlines()] == [["CRITICAL", "CVE-2026-0005"]]


def test_an_unfixable_high_finding_passes(tmp_path):
    result = run_gate(tmp_path, [occurrence("CVE-2026-0003", cvss=8.8, fix_available=False)])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no fixable finding at or above HIGH outside the allowlist (1 occurrence(s) read, 0 allowlisted)" in result.stdout


def test_the_cuda_12_cves_are_allowed_in_the_gpu_images_with_their_reason_and_nowhere_else(tmp_path):
    scan = [cuda("CVE-2025-23308"), cuda("CVE-2025-23339")]
    for image in ("tf-runtime-gpu", "cassava-trainer-gpu"):
        result = run_gate(tmp_path, scan, image=image)
        assert result.returncode == 0, result.stdout + result.stderr
        allowed = result.stdout.splitlines()[:2]
        assert [line.split(": ")[0] for line in allowed] == ["allowed until 2027-02-28"] * 2
        assert "CVE-2025-23308 nvidia-cuda-nvcc-cu12 12.9.86 -> fixed in 13.0.48" in allowed[0]
        assert "only in CUDA 13" in allowed[0] and "2 allowlisted" in result.stdout
    result = run_gate(tmp_path, scan, image="tf-runtime-cpu")
    assert result.returncode == 1
    assert [line.split()[1] for line in result.stdout.splitlines()] == ["CVE-2025-23308", "CVE-2025-23339"]


def test_an_expired_entry_fails_every_gate_even_with_nothing_found(tmp_path):
    assert run_gate(tmp_path, [], today="2027-02-28").returncode == 0  # the review-by day itself still holds
    result = run_gate(tmp_path, [], today="2027-03-01")
    assert result.returncode == 1
    assert result.stdout.splitlines() == [
        "expired allowlist entry: CVE-2025-23308 for tf-runtime-gpu, cassava-trainer-gpu, review by 2027-02-28: "
        "review it, then move its date or remove it",
        "expired allowlist entry: CVE-2025-23339 for tf-runtime-gpu, cassava-trainer-gpu, review by 2027-02-28: "
        "review it, then move its date or remove it"]
    # and the expired entry no longer allows its finding
    result = run_gate(tmp_path, [cuda("CVE-2025-23308")], image="tf-runtime-gpu", today="2027-03-01")
    assert "HIGH CVE-2025-23308 nvidia-cuda-nvcc-cu12" in result.stdout


def test_every_committed_entry_is_complete_and_has_a_review_date_in_the_future():
    entries = scan_gate.load_allowlist(str(ALLOWLIST))
    assert {e.cve for e in entries} >= {"CVE-2025-23308", "CVE-2025-23339"}
    assert all(e.review_by > datetime.date(2026, 11, 26) for e in entries)


@pytest.mark.parametrize("entry, message", [
    ('cve = "CVE-2026-1"\nimages = ["a"]\nreason = "r r r r r"\nreview_by = 2027-01-01', "is not a CVE, GHSA or PYSEC id"),
    ('cve = "CVE-2026-10001"\nimages = ["a"]\nreason = "r r r r r"', "missing review_by"),
    ('cve = "CVE-2026-10001"\nimages = ["a"]\nreason = "because"\nreview_by = 2027-01-01', "reason must say why"),
    ('cve = "CVE-2026-10001"\nimages = []\nreason = "r r r r r"\nreview_by = 2027-01-01', "images must be a non-empty list"),
    ('cve = "CVE-2026-10001"\nimages = ["a"]\nreason = "r r r r r"\nreview_by = "soon"', "review_by must be a date"),
    ('cve = "CVE-2026-10001"\nimages = ["a"]\nreason = "r r r r r"\nreview_by = 2027-01-01\nowner = "me"', "unknown owner"),
])
def test_a_malformed_allowlist_entry_is_one_line_and_exit_code_2(tmp_path, entry, message):
    allowlist = tmp_path / "allowlist.toml"
    allowlist.write_text(f"[[allow]]\n{entry}\n")
    result = run_gate(tmp_path, [], allowlist=allowlist)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and message in result.stderr, result.stderr


@pytest.mark.parametrize("scan, args, message", [
    ("{not json", (), "not valid JSON"),
    ('{"vulnerability": {}}', (), "expected a JSON list of occurrences, got dict"),
    ('[{"kind": "VULNERABILITY"}]', (), "occurrence 0 has no 'vulnerability' object"),
    ("[]", ("--severity", "SEVERE"), "unknown severity 'SEVERE'"),
    ("[]", ("--today", "tomorrow"), "--today 'tomorrow' is not a date"),
])
def test_bad_input_is_one_line_and_exit_code_2(tmp_path, scan, args, message):
    result = run_gate(tmp_path, scan, *args)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and message in result.stderr, result.stderr
    assert result.stdout == ""


def test_the_image_must_be_named(tmp_path):
    (tmp_path / "v.json").write_text("[]")
    result = subprocess.run([sys.executable, str(REPO / "scripts" / "supply_chain" / "scan_gate.py"), str(tmp_path / "v.json")],
                            capture_output=True, text=True)
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and "--image" in result.stderr
