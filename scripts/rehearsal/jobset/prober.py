"""Running one probe against a running container, as the kubelet's probers do (kubernetes/kubernetes
pkg/kubelet/prober/prober.go, pkg/probe/exec, pkg/probe/http, pkg/probe/tcp):
- exec: the command runs inside the container (`exec` of the engine, as the kubelet's ExecSync
  through the runtime), as written; exit 0 is success, any other exit or running past
  timeoutSeconds is failure;
- httpGet: a GET from this machine (the kubelet's node) to the pod's own address (or `host`) and
  port, path and headers, with the kubelet's User-Agent unless a header sets one; a status from
  200 to 399 is success; HTTPS is not verified, as the kubelet does not verify it; a redirect is
  not followed, its 3xx counts as success (the kubelet follows one to the same host and judges
  the answer there, and counts one to another host as success);
- tcpSocket: a TCP connection to the pod's address (or `host`) and port, opened within timeoutSeconds.
"""

from __future__ import annotations

import http.client
import socket
import ssl
import subprocess

from scripts.rehearsal.engine import Engine
from scripts.rehearsal.jobset.probes import Probe

USER_AGENT = "kube-probe/1.33"  # what the kubelet sends: kube-probe/MAJOR.MINOR


def succeeds(probe: Probe, engine: Engine, container: str, address: str) -> bool:
    """Whether `probe` succeeds once against `container` (the engine's name for it), whose pod
    address on its network is `address`."""
    if probe.handler == "exec":
        try:
            result = engine.run("exec", container, *probe.command, timeout=probe.timeout)
        except subprocess.TimeoutExpired:
            return False
        return result.returncode == 0
    host = probe.host or address
    if probe.handler == "tcpSocket":
        try:
            with socket.create_connection((host, probe.port), timeout=probe.timeout):
                return True
        except OSError:
            return False
    if probe.scheme == "HTTPS":
        unverified = ssl.create_default_context()
        unverified.check_hostname, unverified.verify_mode = False, ssl.CERT_NONE
        connection = http.client.HTTPSConnection(host, probe.port, timeout=probe.timeout, context=unverified)
    else:
        connection = http.client.HTTPConnection(host, probe.port, timeout=probe.timeout)
    headers = dict(probe.headers)
    if not any(name.lower() == "user-agent" for name in headers):
        headers["User-Agent"] = USER_AGENT
    try:
        connection.request("GET", probe.path, headers=headers)
        return 200 <= connection.getresponse().status < 400
    except (OSError, http.client.HTTPException):
        return False
    finally:
        connection.close()
