"""JobSet's own examples (tests/container/jobset_examples/, kubernetes-sigs/jobset v0.12.0), run by
`submit_job.py local --jobset` with only the image swapped for the project's CPU image, each
ending as JobSet documents it: success or failure, which Jobs start after which, restarts.

Their commands are shell lines (`sleep`, `echo`) that the CPU image runs as well as busybox or
bash:latest. A sixth JobSet, ours, probes a server over the network. The rehearsals run at once, in one fixture: they mostly sleep, so together they
take about as long as the longest alone. Each test then reads its own run's lines."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from containers import leftovers, user_env
from helpers import REPO
from test_vertex_rehearsal import lines

PYTHON = str(REPO / ".venv" / "bin" / "python")
EXAMPLES = Path(__file__).parent / "jobset_examples"


def swapped(path: str, image: str) -> dict:
    """The example with every container's image replaced by `image`, and nothing else changed."""
    manifest = yaml.safe_load((EXAMPLES / path).read_text())
    for rjob in manifest["spec"]["replicatedJobs"]:
        for container in rjob["template"]["spec"]["template"]["spec"]["containers"]:
            container["image"] = image
    return manifest


def driver_ready_example(image: str) -> dict:
    """startup-driver-ready with two sleeps shortened, the only change besides the image: its driver
    sleeps 1000 s (17 minutes) and its workers 100 s, and the JobSet succeeds only when all have
    ended. The driver still outlives its 30 s readinessProbe delay, so the workers still wait for
    it to be Ready, as in the example. By 45 s: with 10 s, a rehearsal from nothing on 2 busy cores
    saw the driver end before its probe had run, and a pod that succeeded counts as Ready to JobSet,
    so the workers started with no probe line to order them by."""
    manifest = swapped("startup-policy/startup-driver-ready.yaml", image)
    driver, workers = (rjob["template"]["spec"]["template"]["spec"]["containers"][0]
                       for rjob in manifest["spec"]["replicatedJobs"])
    assert (driver["args"], workers["args"]) == (["1000s"], ["100s"])  # as JobSet ships it
    driver["args"], workers["args"] = ["75s"], ["5s"]
    return manifest


def network_probes(image: str) -> dict:
    """Not one of JobSet's examples: a server whose startupProbe (tcpSocket) and readinessProbe
    (httpGet) reach it at its pod's address only once it serves, and a client created once it is
    Ready, which reads from it at once."""
    server = {"name": "server", "image": image,
              "command": ["sh", "-c", "sleep 3 && exec python -m http.server 8080"],
              "ports": [{"name": "http", "containerPort": 8080}],
              "startupProbe": {"tcpSocket": {"port": 8080}, "periodSeconds": 1, "failureThreshold": 30},
              "readinessProbe": {"httpGet": {"port": "http", "path": "/"}, "periodSeconds": 1}}
    client = {"name": "client", "image": image, "command": [
        "python", "-c", "import urllib.request; print(urllib.request.urlopen("
        "'http://probes-server-0-0.probes:8080/', timeout=5).status)"]}
    return {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {"name": "probes"}, "spec": {
        "successPolicy": {"operator": "All", "targetReplicatedJobs": ["client"]},
        "replicatedJobs": [
            # A python server is PID 1 here, which ignores SIGTERM: a short grace ends the run sooner.
            {"name": "server", "template": {"spec": {"template": {"spec": {
                "terminationGracePeriodSeconds": 1, "containers": [server]}}}}},
            {"name": "client", "dependsOn": [{"name": "server", "status": "Ready"}],
             "template": {"spec": {"backoffLimit": 0, "template": {"spec": {"containers": [client]}}}}}]}}


@pytest.fixture(scope="module")
def example_runs(engine, cpu_image, tmp_path_factory):
    """{example: (exit code, stdout)} for every example, rehearsed at once."""
    manifests = {path: swapped(path, cpu_image) for path in (
        "depends-on/depends-on.yaml", "depends-on/multiple-depends-on.yaml", "simple/success-policy.yaml",
        "failure-policy/failjobset-action.yaml")}
    manifests["startup-policy/startup-driver-ready.yaml"] = driver_ready_example(cpu_image)
    manifests["network-probes"] = network_probes(cpu_image)
    directory = tmp_path_factory.mktemp("jobset-examples")
    started = {}
    for path, manifest in manifests.items():
        written = directory / path.replace("/", "-")
        written.write_text(yaml.safe_dump(manifest))
        started[path] = subprocess.Popen([PYTHON, "-m", "scripts.submit_job", "local", "--engine", engine[0],
                                          "--jobset", str(written)], cwd=REPO, env=user_env(),
                                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    runs = {}
    for path, process in started.items():
        stdout, stderr = process.communicate(timeout=900)
        runs[path] = (process.returncode, stdout + stderr)
    yield runs
    assert leftovers(engine) == []


def notes(output: str) -> list[str]:
    return lines(output, "local-run")


def first(output: str, source: str, text: str = "") -> int:
    """The number of the run's first line from `source` (a pod's hostname, or local-run) holding `text`."""
    number = first_if_any(output, source, text)
    if number is None:
        raise AssertionError(f"no line of {source} says {text!r}:\n{output[-3000:]}")
    return number


def first_if_any(output: str, source: str, text: str = "") -> int | None:
    for number, line in enumerate(output.splitlines()):
        parts = line.split(None, 2)
        if parts[:1] == [source] and text in (parts[2] if len(parts) == 3 else ""):
            return number
    return None


def ran_once(said: list[str], pods) -> bool:
    return all(f"{pod}: exit codes 0; restarts 0" in said for pod in pods)


def test_depends_on_starts_the_launcher_after_the_initializer_completes_and_the_workers_once_it_is_ready(example_runs):
    code, output = example_runs["depends-on/depends-on.yaml"]
    said = notes(output)
    assert code == 0 and said[-1].endswith("succeeded (successPolicy met)"), output[-3000:]
    launcher_created = first(output, "local-run", "launcher: initializer is Complete: creating its Jobs")
    # The launcher is Ready once its startup probe has succeeded (5 s after it starts, then every
    # 10 s), or once its Job is Complete (20 s): JobSet counts a succeeded Job as Ready. On a loaded
    # machine (this fixture runs six JobSets at once) the probe's exec may not succeed before then;
    # either way the workers come after.
    ready_lines = [number for number in (
        first_if_any(output, "local-run", "depends-on-launcher-0-0: startupProbe succeeded"),
        first_if_any(output, "local-run", "Job depends-on-launcher-0: Complete")) if number is not None]
    workers_created = first(output, "local-run", "worker: launcher is Ready: creating its Jobs")
    assert first(output, "depends-on-initializer-0-0", "initializer runs for 10 seconds") < launcher_created
    assert launcher_created < first(output, "depends-on-launcher-0-0", "launcher runs for 20 seconds")
    assert ready_lines and launcher_created < min(ready_lines) < workers_created, output[-3000:]
    assert workers_created < min(first(output, f"depends-on-worker-0-{i}", "worker runs for 20 seconds") for i in range(4))
    assert ran_once(said, ["depends-on-initializer-0-0", "depends-on-launcher-0-0",
                           *(f"depends-on-worker-0-{i}" for i in range(4))])


def test_multiple_depends_on_starts_the_workers_once_both_initializers_complete(example_runs):
    code, output = example_runs["depends-on/multiple-depends-on.yaml"]
    said = notes(output)
    assert code == 0 and said[-1].endswith("succeeded (successPolicy met)"), output[-3000:]
    created = first(output, "local-run",
                    "worker: dataset-initializer is Complete and model-initializer is Complete: creating its Jobs")
    for initializer in ("dataset-initializer", "model-initializer"):
        assert first(output, f"multiple-depends-on-{initializer}-0-0", "runs for 10 seconds") < created
    assert created < min(first(output, f"multiple-depends-on-worker-0-{i}", "worker runs") for i in range(4))
    assert ran_once(said, [f"multiple-depends-on-worker-0-{i}" for i in range(4)])


def test_startup_driver_ready_creates_the_workers_once_the_drivers_readiness_probe_passes(example_runs):
    code, output = example_runs["startup-policy/startup-driver-ready.yaml"]
    said = notes(output)
    assert code == 0 and said[-1].endswith("succeeded (successPolicy met)"), output[-3000:]
    assert not any("readinessProbe" in line for line in said[:3])  # the first lines no longer call it not emulated
    ready = first(output, "local-run", "startup-driver-ready-driver-0-0: Ready (readinessProbe succeeded)")
    created = first(output, "local-run", "workers: driver is Ready: creating its Jobs")
    assert ready < created
    assert ran_once(said, [f"startup-driver-ready-workers-0-{i}" for i in range(4)])


def test_success_policy_succeeds_when_the_workers_finish_and_stops_the_leader(example_runs):
    code, output = example_runs["simple/success-policy.yaml"]
    said = notes(output)
    assert code == 0 and said[-1].endswith("succeeded (successPolicy met)"), output[-3000:]
    assert ran_once(said, [f"success-policy-workers-0-{i}" for i in range(2)])
    # The leader (sleep 10000) never ends by itself: the JobSet's end stops it.
    [leader] = [line for line in said if line.startswith("success-policy-leader-0-0: exit codes ")]
    assert not leader.startswith("success-policy-leader-0-0: exit codes 0;"), leader


def test_failjobset_action_fails_the_jobset_when_the_leader_job_fails(example_runs):
    code, output = example_runs["failure-policy/failjobset-action.yaml"]
    said = notes(output)
    assert code == 1, output[-3000:]
    assert "(failurePolicy: FailJobSet, rule failurePolicyRule0)" in said[-1], said[-1]
    assert "Job failjobset-action-example-leader-0 failed (BackoffLimitExceeded)" in said[-1]
    assert "Sleeping in 1" in lines(output, "failjobset-action-example-leader-0-0")
    assert not any("recreates every Job" in line for line in said)  # no restart of the JobSet


def test_tcp_and_http_probes_reach_the_pods_address_and_ready_means_serving(example_runs):
    code, output = example_runs["network-probes"]
    said = notes(output)
    assert code == 0 and said[-1].endswith("succeeded (successPolicy met)"), output[-3000:]
    started = first(output, "local-run", "probes-server-0-0: startupProbe succeeded")
    ready = first(output, "local-run", "probes-server-0-0: Ready (readinessProbe succeeded)")
    assert started <= ready < first(output, "local-run", "client: server is Ready: creating its Jobs")
    assert lines(output, "probes-client-0-0", "INFO") == ["200"]
    assert ran_once(said, ["probes-client-0-0"])
