"""scripts/rehearsal/engine_front.py in front of podman's own API service, as the Cloud Build
rehearsal and images.sh's structure tests run it: a container's exit code and a missing container
come back as podman's Docker API gives them, and benchmarks/engine_wait.py measures the service's
CPU over a wait both ways. (The Cloud Build tests run the docker CLI's builds, copies and pushes
through it.)"""

from __future__ import annotations

import datetime
import json
import os
import re
import subprocess
import sys
import threading
import time

import pytest

from helpers import REPO, clean_env
from scripts.rehearsal import engine_front

sys.path.insert(0, str(REPO / "benchmarks"))
import engine_wait  # noqa: E402


@pytest.fixture
def service(engine, tmp_path):
    """(the front's socket, podman's socket) on a service of the test's own."""
    tool, env = engine
    if tool != "podman":
        pytest.skip("the front is for podman's API service; Docker's daemon has no busy wait")
    engine_socket, front_socket = str(tmp_path / "podman.sock"), str(tmp_path / "front.sock")
    process = subprocess.Popen(["podman", "system", "service", "--time=0", f"unix://{engine_socket}"], env=env, cwd="/",
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    front = None
    try:
        for _ in range(150):
            if os.path.exists(engine_socket):
                try:
                    if engine_wait.api(engine_socket, "GET", "/_ping", timeout=2)[0] == 200:
                        break
                except OSError:
                    pass
            time.sleep(0.2)
        front = engine_front.Front(front_socket, engine_socket)
        threading.Thread(target=front.serve_forever, args=(0.1,), daemon=True).start()
        yield front_socket, engine_socket
    finally:
        if front is not None:
            front.close()
        process.terminate()
        process.wait(timeout=30)


def test_a_wait_through_the_front_gives_the_exit_code_and_a_missing_container_podmans_404(service, base_image):
    front_socket, engine_socket = service
    status, body = engine_wait.api(engine_socket, "POST", "/v1.41/containers/create",
                                   {"Image": base_image, "Entrypoint": ["sh", "-c"], "Cmd": ["sleep 1; exit 5"]})
    assert status == 201, body
    container = json.loads(body)["Id"]
    try:
        assert engine_wait.api(front_socket, "POST", f"/v1.41/containers/{container}/start")[0] == 204
        # While it runs, then once it has stopped: the same exit code either way.
        for _ in range(2):
            status, body = engine_wait.api(front_socket, "POST", f"/v1.41/containers/{container}/wait")
            assert (status, json.loads(body)) == (200, {"StatusCode": 5, "Error": None})
        # Any other request passes as it came: podman's own answer for this container.
        status, body = engine_wait.api(front_socket, "GET", f"/v1.41/containers/{container}/json")
        assert status == 200 and json.loads(body)["State"]["ExitCode"] == 5
    finally:
        engine_wait.api(engine_socket, "DELETE", f"/v1.41/containers/{container}?force=true")
    missing = engine_wait.api(front_socket, "POST", "/v1.41/containers/no-such-container/wait")
    direct = engine_wait.api(engine_socket, "POST", "/v1.41/containers/no-such-container/wait")
    assert missing[0] == direct[0] == 404 and "no such container" in json.loads(missing[1])["message"]


def test_the_engine_wait_benchmark_measures_both_ways_and_writes_its_results_file(engine, base_image, tmp_path):
    """One round of 1-second containers: the run's figures agree with each other and the file is
    written (what the figures are is the benchmark's to say, not this test's)."""
    if engine[0] != "podman":
        pytest.skip("the benchmark measures podman's API service")
    argv = ["--image", base_image, "--rounds", "1", "--seconds", "1", "--results-dir", str(tmp_path)]
    day = datetime.date.today().isoformat()
    result = subprocess.run([sys.executable, "benchmarks/engine_wait.py", *argv], cwd=REPO,
                            env={**clean_env(), **engine[1]}, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:] + result.stdout[-2000:]
    measured = dict(re.findall(r"^round 1: (podman wait|as written) +(\d+\.\d\d) CPU s", result.stdout, re.M))
    assert set(measured) == {"podman wait", "as written"}, result.stdout
    ratio = re.search(r"^as written / podman wait: x(\d+\.\d\d) of the CPU", result.stdout, re.M)
    assert ratio and float(measured["podman wait"]) > 0, result.stdout
    (written,) = (tmp_path / "engine_wait").glob("*.md")
    text = written.read_text()
    assert text.startswith("# engine_wait on ") and day in text.splitlines()[2] and "as written / podman wait: x" in text
    bad = subprocess.run([sys.executable, "benchmarks/engine_wait.py", "--image", base_image, "--rounds", "0"],
                         cwd=REPO, env=clean_env(), capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and bad.stderr.strip().splitlines() == [
        "python benchmarks/engine_wait.py: error: --rounds must be at least 1 and --seconds above 0 "
        "(--help lists the flags)"]
