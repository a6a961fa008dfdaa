"""Artifact Registry's stand-in: Debian's docker-registry, serving TLS on 127.0.0.1 with a
certificate for Artifact Registry's hosts (`*.pkg.dev`, `gcr.io`, `*.gcr.io`) from a CA made for
the build, and a CONNECT front on 127.0.0.1 that tunnels those hosts, and nothing else, to it. The
engine's API service the steps talk to is started with HTTPS_PROXY at the front and SSL_CERT_FILE
at a bundle that adds the CA (Go's TLS reads it; podman's registry client honours both), so
`docker push REGION-docker.pkg.dev/PROJECT/REPO/IMAGE:TAG` from a step, and the push of `images:`,
land here under `PROJECT/REPO/IMAGE`, with no name in the config changed.

The front admits a client before reading a byte of it (127.0.0.1 only), reads at most a request
line and 100 header lines of 8 kB each, answers anything but CONNECT to a registry host on port
443 with one status line and closes, and runs each connection on its own thread, so an idle client
stalls nobody.
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import socketserver
import ssl
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

from scripts.rehearsal import relay, tls
from trainer.process.ports import free_port

# Artifact Registry's hosts: REGION-docker.pkg.dev, and gcr.io names it serves since Container
# Registry's shutdown.
REGISTRY_HOST = re.compile(r"^(?:[a-z0-9-]+-docker\.pkg\.dev|(?:[a-z]+\.)?gcr\.io)$")
LINE_BYTES = 8192
HEADER_LINES = 100
READ_TIMEOUT_SECONDS = 30


class RegistryError(RuntimeError):
    """str() is one line."""


def make_certificates(directory: Path) -> tuple[Path, Path, Path]:
    """(CA certificate, server certificate, server key) for Artifact Registry's hosts and
    127.0.0.1, valid for a day."""
    return tls.issue(directory, "cloud build rehearsal CA", ["*.pkg.dev", "gcr.io", "*.gcr.io"], ["127.0.0.1"],
                     names=("registry-ca.pem", "registry.pem", "registry.key"))


class _Front(socketserver.ThreadingMixIn, socketserver.TCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, backend_port: int, refused):
        self.backend_port, self.refused = backend_port, refused
        super().__init__(("127.0.0.1", 0), _Tunnel)

    def verify_request(self, request, client_address) -> bool:
        # Admitted before a byte is read: the loopback alone.
        return client_address[0] == "127.0.0.1"


class _Tunnel(socketserver.StreamRequestHandler):
    rbufsize = 0  # unbuffered: not a byte of the client's TLS is read ahead of the tunnel

    def _reply(self, status: str) -> None:
        self.connection.sendall(f"HTTP/1.1 {status}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".encode())

    def handle(self) -> None:
        self.connection.settimeout(READ_TIMEOUT_SECONDS)
        try:
            request = self.rfile.readline(LINE_BYTES)
            for _ in range(HEADER_LINES):
                header = self.rfile.readline(LINE_BYTES)
                if header in (b"\r\n", b"\n", b""):
                    break
            else:
                return self._reply("431 Request Header Fields Too Large")
        except (OSError, socket.timeout):
            return
        parts = request.decode("latin-1").split()
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            return self._reply("400 Bad Request")
        if parts[0] != "CONNECT":
            return self._reply("405 Method Not Allowed")
        host, _, port = parts[1].rpartition(":")
        if port != "443" or not REGISTRY_HOST.match(host.lower()):
            self.server.refused(parts[1])
            return self._reply("403 Forbidden")
        try:
            backend = socket.create_connection(("127.0.0.1", self.server.backend_port), timeout=10)
        except OSError:
            return self._reply("502 Bad Gateway")
        self.connection.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
        relay.both_ways(self.connection, backend)
        backend.close()


class ArtifactRegistry:
    """docker-registry and its front, started together, stopped together."""

    def __init__(self, directory: Path, note=lambda line: None, storage: Path | None = None):
        """Its config, certificates, key and log in `directory`; the images in `storage` (default
        directory/storage), which a later registry may reuse."""
        self.directory, self.note = directory, note
        self.storage = storage or directory / "storage"
        self.process: subprocess.Popen | None = None
        self.front: _Front | None = None
        self.port = 0
        self.refusals: list[str] = []

    def start(self) -> None:
        binary = shutil.which("docker-registry")
        if not binary:
            raise RegistryError("Debian's docker-registry is not installed (scripts/supply_chain/install_image_tools.sh)")
        self.directory.mkdir(parents=True, exist_ok=True)
        self.ca, certificate, key = make_certificates(self.directory)
        self.port = free_port()
        config = self.directory / "registry.yml"
        config.write_text(json.dumps({
            "version": 0.1, "log": {"level": "error", "accesslog": {"disabled": True}},
            "storage": {"filesystem": {"rootdirectory": str(self.storage)}, "delete": {"enabled": True}},
            "http": {"addr": f"127.0.0.1:{self.port}", "tls": {"certificate": str(certificate), "key": str(key)}}}))
        log = open(self.directory / "registry.log", "wb")
        self.process = subprocess.Popen([binary, "serve", str(config)], stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    raise RegistryError(f"docker-registry did not start; see {self.directory / 'registry.log'}") from None
                time.sleep(0.2)
        self.front = _Front(self.port, self._refused)
        threading.Thread(target=self.front.serve_forever, daemon=True).start()
        from scripts.rehearsal.local_gcs.ca import system_ca_bundle

        system = system_ca_bundle()
        self.bundle = self.directory / "ca-bundle.pem"
        self.bundle.write_bytes((system.read_bytes() if system else b"") + b"\n" + self.ca.read_bytes())

    def _refused(self, target: str) -> None:
        if target not in self.refusals:
            self.refusals.append(target)
            self.note(f"the Artifact Registry stand-in's front refused CONNECT {target}: only Artifact Registry's "
                      "hosts, port 443, reach it")

    @property
    def front_address(self) -> str:
        return f"127.0.0.1:{self.front.server_address[1]}"

    def engine_environment(self) -> dict[str, str]:
        """What makes the engine push Artifact Registry's names here."""
        proxy = f"http://{self.front_address}"
        return {"HTTPS_PROXY": proxy, "https_proxy": proxy, "NO_PROXY": "localhost,127.0.0.1",
                "no_proxy": "localhost,127.0.0.1", "SSL_CERT_FILE": str(self.bundle)}

    def get(self, path: str, accept: str = "application/vnd.docker.distribution.manifest.v2+json, "
            "application/vnd.oci.image.manifest.v1+json") -> tuple[int, dict, bytes]:
        """A GET of the registry API (/v2/...): (status, headers, body)."""
        context = ssl.create_default_context(cafile=str(self.ca))
        request = urllib.request.Request(f"https://127.0.0.1:{self.port}{path}", headers={"Accept": accept})
        try:
            with urllib.request.urlopen(request, context=context, timeout=30) as response:
                return response.status, dict(response.headers), response.read()
        except urllib.error.HTTPError as error:
            return error.code, dict(error.headers), error.read()

    def tags(self, repository: str) -> list[str]:
        status, _, body = self.get(f"/v2/{repository}/tags/list")
        return sorted(json.loads(body).get("tags") or []) if status == 200 else []

    def digest(self, repository: str, tag: str) -> str | None:
        status, headers, _ = self.get(f"/v2/{repository}/manifests/{tag}")
        return headers.get("Docker-Content-Digest") if status == 200 else None

    def close(self) -> None:
        if self.front is not None:
            self.front.shutdown()
            self.front.server_close()
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
