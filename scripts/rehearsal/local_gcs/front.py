"""The HTTPS face of the local Cloud Storage server: a CONNECT proxy and a TLS endpoint (`Front`),
what it admits, and how it forwards a request to fake-gcs-server or the real Cloud Storage."""

from __future__ import annotations

import http.client
import http.server
import ipaddress
import json
import re
import select
import socket
import socketserver
import ssl
import sys
import threading
import time
import urllib.error
import urllib.request
from typing import Callable

from scripts.rehearsal.local_gcs.ca import GOOGLE_HOSTS
from scripts.rehearsal.local_gcs.faults import Fault

# Hop-by-hop headers (RFC 9110 section 7.6.1) and the ones Front recomputes.
_NOT_FORWARDED = {"connection", "keep-alive", "proxy-connection", "proxy-authorization", "te", "trailer",
                  "transfer-encoding", "upgrade", "content-length"}
_STORAGE_LAYOUT = re.compile(r"^/storage/v1/b/([^/?]+)/storageLayout(\?.*)?$")
# The bucket a request names: JSON API (www.googleapis.com) or XML-style reads (storage.googleapis.com).
_API_BUCKET = re.compile(r"^(?:/upload)?/storage/v1/b/([^/?]+)/")
_READ_BUCKET = re.compile(r"^/([^/?]+)/")
# What a read from the real Cloud Storage carries over: never the job's (dummy) credentials.
_UPSTREAM_REQUEST_HEADERS = {"range", "accept", "if-match", "if-none-match", "if-modified-since", "if-unmodified-since"}
# Reads of objects (not of the bucket itself), by API: what may come from the real Cloud Storage.
_API_OBJECTS = re.compile(r"^/storage/v1/b/[^/?]+/o(?:[/?]|$)")
_READ_OBJECT = re.compile(r"^/[^/?]+/[^?]")


class Front:
    """The HTTPS face of the server: a CONNECT proxy and a TLS endpoint on one port of each address
    it listens on (loopback, and the gateway of each container network a job runs on).

    What it lets in, and in what order:
    - a connection is accepted, and its peer's address checked against loopback and the admitted
      networks before one byte of it is read; any other peer is closed unread;
    - each admitted connection gets its own thread, which alone waits for its first byte (TLS or a
      proxy request), does the handshake and reads its requests: a client that connects and sends
      nothing holds up nobody else, and is closed after IDLE_SECONDS;
    - CONNECT to a Google Cloud Storage host is answered here, with a certificate of the local CA;
      CONNECT to a host named in `allowed_hosts` is tunnelled; any other CONNECT (the host's own
      loopback services, its network, the metadata server, the internet) gets 403 and one line
      through `log`;
    - only requests that arrive over TLS for a Cloud Storage host are served; a plain proxy
      request (GET http://...) gets 403.
    Objects of buckets the server does not hold are read, when `upstream` is set (a base URL, where
    `{host}` stands for the host asked), from the real Cloud Storage (anonymously: public objects such as Keras' ImageNet weights, which Vertex
    downloads too); everything else about such a bucket is answered as Cloud Storage answers a
    missing bucket.
    """

    def __init__(self, backend_port: int, tls: ssl.SSLContext, *, allowed_hosts=(), upstream: str | None = None,
                 log: Callable[[str], None] | None = None):
        self.backend_port = backend_port
        self.tls = tls
        self.clients: tuple = ()  # networks admitted besides loopback
        self.allowed_hosts = frozenset(host.lower() for host in allowed_hosts)
        self.upstream = upstream.rstrip("/") if upstream else None
        self.log = log or (lambda line: None)
        self.latency_seconds = 0.0
        self.faults: list[Fault] = []
        self.requests = 0
        self.buckets: set[str] = set()
        self.lock = threading.Lock()
        self.listeners: list[_Listener] = []
        self._said: set[str] = set()

    def listen(self, host: str, port: int = 0) -> int:
        """Starts answering on host:port (port 0: any free one); returns the port."""
        listener = _Listener((host, port), self)
        with self.lock:
            self.listeners.append(listener)
        threading.Thread(target=listener.serve_forever, name=f"local-gcs-front-{host}", daemon=True).start()
        return listener.server_address[1]

    def admit(self, network: str) -> None:
        """Lets clients from `network` (a container network's subnet) connect."""
        with self.lock:
            self.clients += (ipaddress.ip_network(network, strict=False),)

    def admits(self, address: str) -> bool:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
        if getattr(ip, "ipv4_mapped", None):
            ip = ip.ipv4_mapped
        return ip.is_loopback or any(ip in network for network in self.clients)

    def say_once(self, key: str, line: str) -> None:
        with self.lock:
            if key in self._said:
                return
            self._said.add(key)
        self.log(line)

    def may_tunnel(self, host: str, port: int) -> bool:
        """Only hosts named in allowed_hosts (`HOST` for port 443, `HOST:PORT`, or `*` for any). A name that
        resolves to a loopback, link-local or unspecified address is refused unless that address
        itself, or `localhost`, was the name allowed: a public name never legitimately points there."""
        host = host.lower()
        if "*" in self.allowed_hosts:
            return True
        if not ((port == 443 and host in self.allowed_hosts) or f"{host}:{port}" in self.allowed_hosts):
            return False
        if _is_ip(host) or host == "localhost":
            return True
        try:
            addresses = {info[4][0] for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)}
        except OSError:
            return True  # the connection attempt will report it
        return not any(_is_local(address) for address in addresses)

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

    def close(self) -> None:
        with self.lock:
            listeners, self.listeners = self.listeners, []
        for listener in listeners:
            listener.shutdown()
            listener.server_close()


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text.strip("[]"))
        return True
    except ValueError:
        return False


def _is_local(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    return ip.is_loopback or ip.is_link_local or ip.is_unspecified


class _Listener(socketserver.ThreadingMixIn, socketserver.TCPServer):
    """One listening address of the Front. (socketserver's HTTPServer is not used: its bind looks
    up the address's host name, which can stall on a container network's gateway.)"""

    daemon_threads = True
    allow_reuse_address = True
    # TensorFlow's client opens a new connection for every request, eight or more at once when a
    # pipeline reads files in parallel. socketserver's default backlog of 5 drops the rest, and
    # each dropped connection waits a full second for its retry.
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], front: Front):
        self.front = front
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        super().__init__(address, _FrontHandler)

    def server_bind(self):
        # A job network's gateway address may not exist yet: podman brings the bridge up with the
        # network's first container. IP_FREEBIND (Linux) binds to it now and serves once it exists.
        if self.server_address[0] not in ("127.0.0.1", "::1") and sys.platform == "linux":
            self.socket.setsockopt(socket.SOL_IP, _IP_FREEBIND, 1)
        super().server_bind()

    def get_request(self):
        connection, address = super().get_request()
        # Without this, Nagle's algorithm holds the last segment of a response until the client's
        # delayed ACK (up to 40 ms): every other 7 MB read takes 70 ms instead of 30, a wait real
        # Cloud Storage does not add.
        connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return connection, address

    def verify_request(self, request, client_address) -> bool:
        # Before anything of the client is read; a refused one is closed unread.
        if self.front.admits(client_address[0]):
            return True
        self.front.say_once(f"client:{client_address[0]}",
                            f"refused a connection to the Cloud Storage proxy from {client_address[0]}: "
                            "not this machine, nor a job network")
        return False

    def handle_error(self, request, client_address):
        # A client that hangs up, times out or fails its handshake concerns only its own
        # connection; socketserver's default would print a traceback to stderr.
        pass


_IP_FREEBIND = getattr(socket, "IP_FREEBIND", 15)  # Python names it from 3.12; Linux's value is 15
IDLE_SECONDS = 120  # an admitted connection that sends nothing for this long is closed


class _FrontHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = IDLE_SECONDS
    secure = False  # the connection is TLS terminated here: its requests are Cloud Storage's
    server: _Listener

    @property
    def front(self) -> Front:
        return self.server.front

    def setup(self):
        # On this connection's own thread: the first byte says TLS (a container that maps
        # Google's host names here) or a proxy request.
        self.request.settimeout(IDLE_SECONDS)
        if not self.secure and self.request.recv(1, socket.MSG_PEEK) == b"\x16":
            self.request = self.front.tls.wrap_socket(self.request, server_side=True)
            self.secure = True
        super().setup()

    def log_message(self, format, *args):  # a request log per read would drown the test output
        pass

    def do_CONNECT(self):
        host, port = _host_port(self.path)
        if self.secure or host is None:
            return self.send_error(400, "CONNECT takes HOST:PORT, once, on a plain connection")
        if host in GOOGLE_HOSTS and port == 443:
            self.send_response(200, "Connection established")
            self.end_headers()
            try:
                tls = self.front.tls.wrap_socket(self.connection, server_side=True)
            except (ssl.SSLError, OSError):
                self.close_connection = True
                return
            _SecureHandler(tls, self.client_address, self.server)
            self.close_connection = True
            return
        if self.front.may_tunnel(host, port):
            return self._tunnel(host, port)
        self.front.say_once(f"connect:{host}:{port}",
                            f"refused CONNECT {host}:{port} from {self.client_address[0]}: the job's proxy reaches only "
                            "Cloud Storage (allow other hosts by name with --allow-host)")
        self.send_error(403, f"{host}:{port} is not Cloud Storage, and not allowed")
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
        host = self.headers.get("Host", "").rsplit(":", 1)[0].lower() if not self.headers.get("Host", "").startswith("[") else ""
        if not self.secure or host not in GOOGLE_HOSTS:
            self.close_connection = True
            return self._reply(403, {"Content-Type": "text/plain"},
                               b"this proxy serves only https requests to Cloud Storage (use CONNECT)\n")
        body = self._body()
        method, path = self.command, self.path
        fault = self.front.fault_for(method, path)
        if fault and fault.action:
            if fault.action(method, path) and fault.drop:
                self.close_connection = True
                return
        if fault and fault.status:
            return self._reply(fault.status, {"Content-Type": "application/json"}, json.dumps(
                {"error": {"code": fault.status, "message": f"injected by local_gcs ({http.client.responses.get(fault.status, '')})"}}).encode())
        if self.front.latency_seconds:
            time.sleep(self.front.latency_seconds)  # Cloud Storage's time to first byte
        bucket = (_API_BUCKET if host == GOOGLE_HOSTS[0] else _READ_BUCKET).match(path)
        if bucket and not self.front.bucket_exists(bucket.group(1)):
            object_read = (_API_OBJECTS if host == GOOGLE_HOSTS[0] else _READ_OBJECT).match(path)
            if self.front.upstream and method in ("GET", "HEAD") and object_read:
                return self._from_upstream(host, bucket.group(1))
            return self._reply(404, {"Content-Type": "application/json"}, json.dumps(
                {"error": {"code": 404, "message": "The specified bucket does not exist."}}).encode())
        layout = _STORAGE_LAYOUT.match(path)
        if layout and method == "GET":
            return self._reply(200, {"Content-Type": "application/json"}, json.dumps(
                {"kind": "storage#storageLayout", "bucket": layout.group(1), "location": "US-CENTRAL1",
                 "locationType": "region", "hierarchicalNamespace": {"enabled": False}}).encode())
        headers = {k: v for k, v in self.headers.items() if k.lower() not in _NOT_FORWARDED}
        headers["Content-Length"] = str(len(body))
        backend = http.client.HTTPConnection("127.0.0.1", self.front.backend_port, timeout=120)
        try:
            backend.request(method, path, body=body, headers=headers)
            response = backend.getresponse()
            headers = {k: v for k, v in response.getheaders() if k.lower() not in _NOT_FORWARDED}
            if "Location" in headers:
                # fake-gcs-server builds the resumable-upload URL from the scheme it was reached
                # by (plain http here); the client must come back through Front, over https.
                headers["Location"] = re.sub(r"^http://", "https://", headers["Location"])
            self._relay(response.status, headers, response, response.getheader("Content-Length"))
        finally:
            backend.close()

    def _from_upstream(self, host: str, bucket: str):
        """A read of a bucket this server does not hold, from the real Cloud Storage, without the
        job's (dummy) credentials: public objects answer, others say what Cloud Storage says."""
        base = self.front.upstream.format(host=host)
        wanted = {k: v for k, v in self.headers.items() if k.lower() in _UPSTREAM_REQUEST_HEADERS}
        try:
            response = urllib.request.urlopen(urllib.request.Request(base + self.path, headers=wanted, method=self.command),
                                              timeout=60)
        except urllib.error.HTTPError as error:
            response = error
        except (OSError, ValueError) as error:
            self.front.say_once(f"upstream:{bucket}", f"gs://{bucket} is not a local bucket and {base} could not be "
                                f"reached for it ({error}): answering 404")
            return self._reply(404, {"Content-Type": "application/json"}, json.dumps(
                {"error": {"code": 404, "message": f"gs://{bucket}: not local, and {base} is unreachable"}}).encode())
        with response:
            headers = {k: v for k, v in response.headers.items() if k.lower() not in _NOT_FORWARDED}
            self._relay(response.status, headers, response, response.headers.get("Content-Length"))

    def _relay(self, status: int, headers: dict, response, length: str | None):
        if length is None or self.command == "HEAD":
            return self._reply(status, headers, response.read(), head=self.command == "HEAD")
        # Streamed, as Cloud Storage sends a large object: the first bytes arrive before the last.
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", length)
        self.end_headers()
        while chunk := response.read(1 << 20):
            self.wfile.write(chunk)

    def _reply(self, status: int, headers: dict, payload: bytes, head: bool = False):
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if not head:
            self.wfile.write(payload)

    do_GET = do_PUT = do_POST = do_DELETE = do_PATCH = do_HEAD = _forward


class _SecureHandler(_FrontHandler):
    """A connection already TLS terminated (after CONNECT to a Cloud Storage host)."""

    secure = True


def _host_port(target: str) -> tuple[str | None, int]:
    """CONNECT's `host:port` (or `[v6]:port`) -> (lowercase host, port); (None, 0) when malformed."""
    match = re.fullmatch(r"\[([0-9a-fA-F:.]+)\]:(\d{1,5})|([^:\[\]/\s]+):(\d{1,5})", target)
    if not match:
        return None, 0
    host, port = (match.group(1), match.group(2)) if match.group(1) else (match.group(3), match.group(4))
    return host.lower(), int(port)
