"""The local Cloud Storage server's proxy (scripts/rehearsal/local_gcs/), from the side of a hostile client:
it opens nothing on this machine, checks who connects before reading them, and no client can
stall another. The server and its clients are real; the clients are sockets and http.client."""

from __future__ import annotations

import http.client
import http.server
import os
import socket
import ssl
import subprocess
import threading
from pathlib import Path

import pytest

from helpers import parents
from scripts.rehearsal.local_gcs import LocalGCS


class Secret(http.server.BaseHTTPRequestHandler):
    """A service that listens on this machine's loopback only: what a job must never reach."""

    def do_GET(self):
        self.server.hits += 1
        self.send_response(200)
        self.send_header("Content-Length", "6")
        self.end_headers()
        self.wfile.write(b"secret")

    def log_message(self, *args):
        pass


@pytest.fixture
def loopback_service():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Secret)
    server.hits = 0
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture
def proxy(tmp_path):
    said = []
    with LocalGCS(tmp_path / "gcs", log=said.append) as server:
        server.said = said
        server.create_bucket("open-bucket")
        server.upload("open-bucket", "a.txt", b"hello")
        yield server


def connect(server, target: str, address: tuple[str, int] | None = None) -> tuple[int, bytes]:
    """A raw CONNECT through the proxy (at `address`, else its loopback one): (status, what came back)."""
    with socket.create_connection(address or ("127.0.0.1", server.port), timeout=30) as client:
        client.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
        reply = client.recv(4096)
    return int(reply.split()[1]), reply


def read_object(server, bucket: str, name: str, timeout: float = 30) -> bytes:
    """A Cloud Storage read as TensorFlow's client makes it: CONNECT, TLS with the server's CA."""
    context = ssl.create_default_context(cafile=str(server.ca))
    connection = http.client.HTTPSConnection("127.0.0.1", server.port, context=context, timeout=timeout)
    connection.set_tunnel("storage.googleapis.com", 443)
    try:
        connection.request("GET", f"/{bucket}/{name}")
        response = connection.getresponse()
        assert response.status == 200, (response.status, response.read())
        return response.read()
    finally:
        connection.close()


def test_cloud_storage_answers_through_the_proxy(proxy):
    assert read_object(proxy, "open-bucket", "a.txt") == b"hello"


def test_connect_to_this_machines_loopback_services_is_refused_and_said(proxy, loopback_service):
    port = loopback_service.server_address[1]
    for target in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}"):
        status, _ = connect(proxy, target)
        assert status == 403, target
    # The fake server behind the proxy is a loopback service too.
    assert connect(proxy, f"127.0.0.1:{proxy.backend_port}")[0] == 403
    assert loopback_service.hits == 0
    assert any(line.startswith(f"refused CONNECT 127.0.0.1:{port} from 127.0.0.1: the job's proxy reaches only "
                               "Cloud Storage") for line in proxy.said), proxy.said


def test_connect_to_other_hosts_and_metadata_server_is_refused(proxy):
    for target in ("169.254.169.254:80", "pypi.org:443", "storage.googleapis.com:80", "10.0.0.1:22"):
        assert connect(proxy, target)[0] == 403, target


def test_a_plain_proxy_request_gets_nothing(proxy, loopback_service):
    port = loopback_service.server_address[1]
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=30) as client:
        client.sendall(f"GET http://127.0.0.1:{port}/ HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
        reply = client.recv(4096)
    assert reply.split()[1] == b"403" and b"secret" not in reply
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=30) as client:  # nor the bucket API in clear
        client.sendall(b"GET /storage/v1/b/open-bucket/o HTTP/1.1\r\nHost: www.googleapis.com\r\n\r\n")
        assert client.recv(4096).split()[1] == b"403"
    assert loopback_service.hits == 0


def test_an_idle_client_stalls_nobody(proxy):
    """Clients that connect and send nothing, or stop inside a TLS handshake, wait on their own
    threads: a read started after them is answered."""
    silent = socket.create_connection(("127.0.0.1", proxy.port))
    half_handshake = socket.create_connection(("127.0.0.1", proxy.port))
    half_handshake.sendall(b"\x16\x03\x01")  # the start of a TLS record, then nothing
    tunnelled = socket.create_connection(("127.0.0.1", proxy.port))
    tunnelled.sendall(b"CONNECT storage.googleapis.com:443 HTTP/1.1\r\n\r\n")  # and no handshake after it
    try:
        # Without its own thread per client, this read waits for the first client's idle timeout.
        assert read_object(proxy, "open-bucket", "a.txt", timeout=30) == b"hello"
        assert read_object(proxy, "open-bucket", "a.txt", timeout=30) == b"hello"
    finally:
        for client in (silent, half_handshake, tunnelled):
            client.close()


def outside_address() -> str | None:
    """An address of this machine that is not loopback (the source of a client 'from the network')."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("192.0.2.1", 9))  # no packet is sent for a UDP connect
        address = probe.getsockname()[0]
    except OSError:
        return None
    finally:
        probe.close()
    return None if address.startswith("127.") else address


def test_a_client_outside_the_admitted_networks_is_closed_unread(proxy):
    address = outside_address()
    if address is None:
        pytest.skip("this machine has no address besides loopback")
    # The proxy listening beyond loopback, as on a job network's gateway, before that network is admitted.
    port = proxy.front.listen(address, 0)
    with socket.create_connection((address, port), timeout=30) as client:
        client.sendall(b"CONNECT storage.googleapis.com:443 HTTP/1.1\r\n\r\n")
        assert client.recv(4096) == b""  # closed, unanswered
    assert any(line.startswith(f"refused a connection to the Cloud Storage proxy from {address}")
               for line in proxy.said), proxy.said
    proxy.front.admit(f"{address}/32")  # once its network is admitted, the same client is served
    assert connect(proxy, "storage.googleapis.com:443", (address, port))[0] == 200


def test_allowed_hosts_are_tunnelled_and_nothing_else(tmp_path, loopback_service):
    port = loopback_service.server_address[1]
    with LocalGCS(tmp_path / "gcs", allowed_hosts=(f"localhost:{port}",)) as server:
        assert connect(server, f"localhost:{port}")[0] == 200
        assert connect(server, f"127.0.0.2:{port}")[0] == 403


def test_the_private_key_is_its_owners_alone(proxy):
    assert (Path(proxy.root) / "server.key").stat().st_mode & 0o777 == 0o600


def test_a_failed_start_leaves_no_server_running(tmp_path):
    """(The servers counted are this process's children, where LocalGCS starts its server: the run's
    other workers start servers of their own meanwhile.)"""
    def servers() -> set[str]:
        mine = {str(pid) for pid, parent in parents().items() if parent == os.getpid()}
        return set(subprocess.run(["pgrep", "-f", "fake-gcs-server"], capture_output=True, text=True).stdout.split()) & mine

    before = servers()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(OSError):  # the proxy cannot bind: fake-gcs-server is already up by then
            LocalGCS(tmp_path / "gcs", port=taken.getsockname()[1]).start()
    assert servers() <= before


class PublicObjects(http.server.BaseHTTPRequestHandler):
    """Stands in for the real Cloud Storage: one public object, at Keras' ImageNet weights path."""

    path_served = "/tensorflow/keras-applications/resnet/resnet50_weights_tf_dim_ordering_tf_kernels_notop.h5"
    body = os.urandom(3000)

    def do_GET(self):
        self.server.headers_seen.append(dict(self.headers))
        if self.path != self.path_served:
            self.send_error(404)
            return
        start, _, end = self.headers.get("Range", "bytes=0-").removeprefix("bytes=").partition("-")
        part = self.body[int(start):int(end) + 1 if end else None]
        self.send_response(206 if "Range" in self.headers else 200)
        self.send_header("Content-Length", str(len(part)))
        self.end_headers()
        self.wfile.write(part)

    def log_message(self, *args):
        pass


def test_objects_of_buckets_not_held_come_from_the_real_cloud_storage_anonymously(tmp_path):
    public = http.server.ThreadingHTTPServer(("127.0.0.1", 0), PublicObjects)
    public.headers_seen = []
    threading.Thread(target=public.serve_forever, daemon=True).start()
    said = []
    try:
        upstream = f"http://127.0.0.1:{public.server_address[1]}"
        with LocalGCS(tmp_path / "gcs", upstream=upstream, log=said.append) as server:
            bucket, name = PublicObjects.path_served[1:].split("/", 1)
            assert read_object(server, bucket, name) == PublicObjects.body
            context = ssl.create_default_context(cafile=str(server.ca))
            connection = http.client.HTTPSConnection("127.0.0.1", server.port, context=context, timeout=30)
            connection.set_tunnel("storage.googleapis.com", 443)
            connection.request("GET", PublicObjects.path_served, headers={"Range": "bytes=10-19",
                                                                          "Authorization": "Bearer local-gcs"})
            response = connection.getresponse()
            assert (response.status, response.read()) == (206, PublicObjects.body[10:20])
            connection.request("GET", "/tensorflow/no-such-object")
            response = connection.getresponse()
            assert response.status == 404 and response.read()
            connection.close()
            assert all("Authorization" not in seen for seen in public.headers_seen)  # the job's token stays here
        public.shutdown()
        public.server_close()
        with LocalGCS(tmp_path / "gcs2", upstream=upstream, log=said.append) as server:  # unreachable now
            context = ssl.create_default_context(cafile=str(server.ca))
            connection = http.client.HTTPSConnection("127.0.0.1", server.port, context=context, timeout=30)
            connection.set_tunnel("storage.googleapis.com", 443)
            connection.request("GET", PublicObjects.path_served)
            assert connection.getresponse().status == 404
            connection.close()
        assert any("gs://tensorflow is not a local bucket" in line and "could not be reached" in line for line in said), said
    finally:
        public.server_close()
