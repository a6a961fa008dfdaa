"""scripts/supply_chain/scan_gate.py on canned On-Demand Scanning results (no scan can run here), a
test per rule of the gate.

The canned occurrences have exactly the fields of On-Demand Scanning API v1's `Occurrence` and
`VulnerabilityOccurrence` (Google's reference, googleapis.dev/ruby/google-apis-ondemandscanning_v1:
`cvssScore`, `cvssv3`, `cvssV2`, `cvssVersion`, `severity`, `effectiveSeverity`, `fixAvailable`,
`packageIssue[]` of `PackageIssue`: `affectedCpeUri`, `affectedPackage`, `affectedVersion`,
`fixedCpeUri`, `fixedPackage`, `fixedVersion`, `fixAvailable`, `packageType`, `effectiveSeverity`),
laid out as a real Artifact Registry answer is (the one in influxdata/sedg's tests/test_gar.py: a
CVSS 7.1 ncurses finding whose distribution rating is MEDIUM). Every canned occurrence is parsed
into Grafeas v1's own `Occurrence` message with unknown fields refused, so a misspelt or invented
field fails the test rather than pass silently. The gate runs in this process (`run_main`).
"""

import copy
import datetime
import json

import pytest

from helpers import REPO, run_main
from scripts.supply_chain import scan_gate

TODAY = "2026-11-27"
ALLOWLIST = REPO / "images" / "scan-allowlist.toml"


def occurrence(cve, *, cvss=7.1, cvss3=None, cvss2=None, distribution="MEDIUM", provider="HIGH", package="ncurses",
               installed=("6.5+20250216", "2"), fixed=("6.5+20250216", "2+deb13u1"), fix_available=True,
               package_type="OS"):
    """One occurrence, as `gcloud artifacts docker images list-vulnerabilities --format=json` prints it.
    `cvss` is cvssScore; cvssv3's and cvssV2's base scores default to it."""
    def version(name, revision):
        if not revision:  # a Python package's version has no distribution revision
            return {"name": name, "kind": "NORMAL", "fullName": name}
        return {"name": name, "revision": revision, "kind": "NORMAL", "fullName": f"{name}-{revision}"}

    found = {
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
            "cvssv3": {"baseScore": cvss if cvss3 is None else cvss3, "exploitabilityScore": 1.8, "impactScore": 5.2,
                       "attackVector": "ATTACK_VECTOR_LOCAL", "attackComplexity": "ATTACK_COMPLEXITY_LOW",
                       "privilegesRequired": "PRIVILEGES_REQUIRED_NONE", "userInteraction": "USER_INTERACTION_REQUIRED",
                       "scope": "SCOPE_UNCHANGED", "confidentialityImpact": "IMPACT_HIGH",
                       "integrityImpact": "IMPACT_NONE", "availabilityImpact": "IMPACT_HIGH"},
            "cvssVersion": "CVSS_VERSION_3",
        },
    }
    if cvss2 is not None:
        found["vulnerability"]["cvssV2"] = {"baseScore": cvss2, "attackVector": "ATTACK_VECTOR_NETWORK"}
    return found


def cuda(cve, fix_available=True):
    return occurrence(cve, cvss=7.8, distribution="HIGH", provider="HIGH", package="nvidia-cuda-nvcc-cu12",
                      installed=("12.9.86", ""), fixed=("13.0.48", ""), package_type="PYPI", fix_available=fix_available)


def run_gate(tmp_path, scan, *args, image="tf-runtime-cpu", allowlist=ALLOWLIST, today=TODAY):
    path = tmp_path / "vulnerabilities.json"
    path.write_text(scan if isinstance(scan, str) else json.dumps(scan))
    return run_main(scan_gate.main, str(path), "--image", image, "--allowlist", str(allowlist),
                    *(["--today", today] if today else []), *args)


def allowlist_of(tmp_path, *entries) -> str:
    path = tmp_path / "allowlist.toml"
    path.write_text("".join(f"[[allow]]\n{entry}\n" for entry in entries))
    return str(path)


def entry(cve="CVE-2026-10001", package="ncurses", review_by="2027-01-31", reason="r r r r r"):
    return f'cve = "{cve}"\npackage = "{package}"\nreason = "{reason}"\nreview_by = {review_by}\n'


@pytest.mark.parametrize("canned", [occurrence("CVE-2026-0001"), cuda("CVE-2025-23308"),
                                    occurrence("CVE-2026-0003", fix_available=False),
                                    occurrence("CVE-2026-0004", cvss=5.0, cvss3=7.5, cvss2=9.3)])
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
    assert "tf-runtime-cpu: 1 finding(s) at or above HIGH that no allowlist entry covers (1 with a fix" in result.stderr


def test_the_cvss_score_is_the_highest_the_occurrence_gives_not_the_first(tmp_path):
    """cvssScore 5.0, cvssv3 7.5, cvssV2 9.3: the first non-zero score reads MEDIUM, the highest CRITICAL."""
    canned = occurrence("CVE-2026-0012", cvss=5.0, cvss3=7.5, cvss2=9.3, distribution="LOW", provider="LOW")
    finding, = scan_gate.findings([canned])
    assert finding.severity == "CRITICAL" and "CVSS 9.3" in finding.ratings
    result = run_gate(tmp_path, [canned], "--severity", "CRITICAL")
    assert result.returncode == 1 and result.stdout.startswith("CRITICAL CVE-2026-0012 "), result.stdout
    no_score = occurrence("CVE-2026-0011", cvss=0, distribution="LOW", provider="LOW")
    del no_score["vulnerability"]["cvssScore"], no_score["vulnerability"]["cvssv3"]
    assert scan_gate.findings([no_score])[0].severity == "LOW"


def test_the_threshold_can_be_raised_to_critical_only(tmp_path):
    scan = [occurrence("CVE-2026-0004"), occurrence("CVE-2026-0005", cvss=9.1, package="perl-base")]
    result = run_gate(tmp_path, scan, "--severity", "critical")
    assert result.returncode == 1
    assert [line.split()[:2] for line in result.stdout.splitlines()] == [["CRITICAL", "CVE-2026-0005"]]


def test_an_unfixable_high_finding_is_printed_and_fails_the_build(tmp_path):
    result = run_gate(tmp_path, [occurrence("CVE-2026-0003", cvss=8.8, fix_available=False)])
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stdout.splitlines() == [
        "HIGH CVE-2026-0003 ncurses 6.5+20250216-2 -> no fix published (distribution MEDIUM, note HIGH, CVSS 8.8)"]
    assert "(0 with a fix, 1 with none published)" in result.stderr


def test_an_unfixable_finding_below_the_threshold_passes(tmp_path):
    result = run_gate(tmp_path, [occurrence("CVE-2026-0013", cvss=5.5, provider="MEDIUM", fix_available=False)])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no finding at or above HIGH outside the allowlist (1 occurrence(s) read, 0 allowlisted)" in result.stdout


def test_an_entry_covers_its_cve_in_its_package_in_every_image_and_nowhere_else(tmp_path):
    allowlist = allowlist_of(tmp_path, entry("CVE-2026-0020", "ncurses", reason="no fix in trixie yet, not reachable"))
    unfixable = occurrence("CVE-2026-0020", cvss=7.5, fix_available=False)
    for image in ("tf-runtime-cpu", "tf-predictor-cpu", "cassava-trainer-gpu"):
        result = run_gate(tmp_path, [unfixable], image=image, allowlist=allowlist)
        assert result.returncode == 0, result.stdout + result.stderr
        assert result.stdout.startswith("allowed until 2027-01-31: HIGH CVE-2026-0020 ncurses 6.5+20250216-2 -> no fix")
    same_cve_other_package = occurrence("CVE-2026-0020", cvss=7.5, package="libncursesw6", fix_available=False)
    result = run_gate(tmp_path, [same_cve_other_package], allowlist=allowlist)
    assert result.returncode == 1 and result.stdout.startswith("HIGH CVE-2026-0020 libncursesw6 "), result.stdout


def test_a_pypi_package_matches_its_entry_by_its_normalised_name(tmp_path):
    allowlist = allowlist_of(tmp_path, entry("CVE-2025-23308", "nvidia_cuda_nvcc_cu12"))
    assert run_gate(tmp_path, [cuda("CVE-2025-23308")], allowlist=allowlist).returncode == 0


def test_the_cuda_12_cves_are_allowed_with_their_reason_and_other_cves_of_that_package_are_not(tmp_path):
    scan = [cuda("CVE-2025-23308"), cuda("CVE-2025-23339", fix_available=False)]
    for image in ("tf-runtime-gpu", "cassava-trainer-gpu"):
        result = run_gate(tmp_path, scan, image=image)
        assert result.returncode == 0, result.stdout + result.stderr
        allowed = result.stdout.splitlines()[:2]
        assert [line.split(": ")[0] for line in allowed] == ["allowed until 2027-02-25"] * 2
        assert "CVE-2025-23308 nvidia-cuda-nvcc-cu12 12.9.86 -> fixed in 13.0.48" in allowed[0]
        assert "only in CUDA 13" in allowed[0] and "2 allowlisted" in result.stdout
    result = run_gate(tmp_path, [cuda("CVE-2026-31337")], image="tf-runtime-gpu")
    assert result.returncode == 1 and "CVE-2026-31337 nvidia-cuda-nvcc-cu12" in result.stdout


def test_a_review_date_more_than_90_days_ahead_is_refused(tmp_path):
    ninety = (datetime.date.fromisoformat(TODAY) + datetime.timedelta(days=90)).isoformat()
    assert run_gate(tmp_path, [], allowlist=allowlist_of(tmp_path, entry(review_by=ninety))).returncode == 0
    ninety_one = (datetime.date.fromisoformat(TODAY) + datetime.timedelta(days=91)).isoformat()
    result = run_gate(tmp_path, [], allowlist=allowlist_of(tmp_path, entry(review_by=ninety_one)))
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert f"review_by {ninety_one} is more than 90 days after {TODAY}: review it by {ninety} at the latest" in result.stderr


def test_an_expired_entry_fails_every_gate_even_with_nothing_found(tmp_path):
    assert run_gate(tmp_path, [], today="2027-02-25").returncode == 0  # the review-by day itself still holds
    result = run_gate(tmp_path, [], today="2027-02-26")
    assert result.returncode == 1
    assert result.stdout.splitlines() == [
        "expired allowlist entry: CVE-2025-23308 in nvidia-cuda-nvcc-cu12, review by 2027-02-25: "
        "review it, then move its date or remove it",
        "expired allowlist entry: CVE-2025-23339 in nvidia-cuda-nvcc-cu12, review by 2027-02-25: "
        "review it, then move its date or remove it"]
    # and the expired entry no longer allows its finding
    result = run_gate(tmp_path, [cuda("CVE-2025-23308")], image="tf-runtime-gpu", today="2027-02-26")
    assert "HIGH CVE-2025-23308 nvidia-cuda-nvcc-cu12" in result.stdout


@pytest.mark.parametrize("today, code", [("2027-02-25", 0), ("2027-02-26", 1)])
def test_the_check_before_the_build_fails_on_an_expired_entry(today, code):
    result = run_main(scan_gate.main, "--check-only", "--policy", "weekly", "--severity", "HIGH",
                      "--allowlist", str(ALLOWLIST), "--today", today)
    assert result.returncode == code, result.stdout + result.stderr
    if code:
        assert result.stdout.count("expired allowlist entry:") == 2 and "2 expired allowlist entries" in result.stderr
    else:
        assert "policy weekly at HIGH; 2 allowlist entries, none past its review-by date" in result.stdout


@pytest.mark.parametrize("severity, refused", [("HIGH", None), ("high", None), ("MEDIUM", "a lower threshold"),
                                               ("LOW", "a lower threshold"), ("CRITICAL", "a higher one")])
def test_the_weekly_policy_gates_at_high_and_nothing_else(tmp_path, severity, refused):
    result = run_gate(tmp_path, [], "--policy", "weekly", "--severity", severity)
    if refused is None:
        assert result.returncode == 0, result.stderr
        return
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert f"the weekly rebuild gates at HIGH, not {severity}: {refused}" in result.stderr
    check = run_main(scan_gate.main, "--check-only", "--policy", "weekly", "--severity", severity, "--today", TODAY)
    assert check.returncode == 2
    # a build of a commit may gate lower (stricter) or higher
    assert run_gate(tmp_path, [], "--policy", "build", "--severity", severity).returncode == 0


def test_every_committed_entry_is_complete_and_within_its_review_window():
    entries = scan_gate.load_allowlist(str(ALLOWLIST), datetime.date.fromisoformat(TODAY))
    assert {(e.cve, e.package) for e in entries} >= {("CVE-2025-23308", "nvidia-cuda-nvcc-cu12"),
                                                     ("CVE-2025-23339", "nvidia-cuda-nvcc-cu12")}


@pytest.mark.parametrize("text, message", [
    (entry(cve="CVE-2026-1"), "is not a CVE, GHSA or PYSEC id"),
    ('cve = "CVE-2026-10001"\npackage = "a"\nreason = "r r r r r"', "missing review_by"),
    (entry(reason="because"), "reason must say why"),
    (entry(package="two packages"), "package must be one package's name"),
    (entry(review_by='"soon"'), "review_by must be a date"),
    (entry() + 'owner = "me"', "unknown owner"),
    ('cve = "CVE-2026-10001"\nimages = ["a"]\nreason = "r r r r r"\nreview_by = 2027-01-01',
     "missing package; unknown images (entries name a package, not images"),
    (entry() + "[[allow]]\n" + entry(package="NCurses"), "a second entry for CVE-2026-10001 in NCurses"),
])
def test_a_malformed_allowlist_entry_is_one_line_and_exit_code_2(tmp_path, text, message):
    result = run_gate(tmp_path, [], allowlist=allowlist_of(tmp_path, text))
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and message in result.stderr, result.stderr


@pytest.mark.parametrize("scan, args, message", [
    ("{not json", (), "not valid JSON"),
    ('{"vulnerability": {}}', (), "expected a JSON list of occurrences, got dict"),
    ('[{"kind": "VULNERABILITY"}]', (), "occurrence 0 has no 'vulnerability' object"),
    ("[]", ("--severity", "SEVERE"), "unknown severity 'SEVERE'"),
    ("[]", ("--policy", "nightly"), "unknown policy 'nightly'"),
    ("[]", ("--today", "tomorrow"), "--today 'tomorrow' is not a date"),
])
def test_bad_input_is_one_line_and_exit_code_2(tmp_path, scan, args, message):
    result = run_gate(tmp_path, scan, *args)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and message in result.stderr, result.stderr
    assert result.stdout == ""


@pytest.mark.parametrize("args, message", [((), "give a scan result (and --image), or --check-only"),
                                           (("v.json",), "--image names the image"),
                                           (("v.json", "--image", "x", "--check-only"), "give a scan result")])
def test_a_scan_needs_its_image_and_check_only_takes_none(args, message):
    result = run_main(scan_gate.main, *args)
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and message in result.stderr, result.stderr
