"""The Cloud Build rehearsal's Artifact Registry stand-in (scripts/rehearsal/cloudbuild/registry.py),
from a client's side, hostile ones included: docker-registry over TLS for Artifact Registry's
hosts, reached only through its CONNECT front on 127.0.0.1."""

from __future__ import annotations

import socket
import ssl
import threading

import pytest

from scripts.rehearsal.cloudbuild.registry import ArtifactRegistry


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    refused = []
    stand_in = ArtifactRegistry(tmp_path_factory.mktemp("registry"), refused.append)
    stand_in.start()
    stand_in.said = refused
    yield stand_in
    stand_in.close()


def front(registry) -> socket.socket:
    host, port = registry.front_address.split(":")
    return socket.create_connection((host, int(port)), timeout=10)


def ask(registry, request: bytes) -> bytes:
    with front(registry) as client:
        client.sendall(request)
        return client.recv(4096)


def test_a_connect_to_artifact_registry_reaches_the_registry_over_tls_for_that_host(registry):
    with front(registry) as client:
        client.sendall(b"CONNECT us-central1-docker.pkg.dev:443 HTTP/1.1\r\nHost: us-central1-docker.pkg.dev:443\r\n\r\n")
        assert client.recv(4096).startswith(b"HTTP/1.1 200 ")
        context = ssl.create_default_context(cafile=str(registry.ca))
        with context.wrap_socket(client, server_hostname="us-central1-docker.pkg.dev") as tls:
            tls.sendall(b"GET /v2/ HTTP/1.1\r\nHost: us-central1-docker.pkg.dev\r\nConnection: close\r\n\r\n")
            answer = tls.recv(4096)
    assert answer.startswith(b"HTTP/1.1 200 ") and b"Docker-Distribution-Api-Version: registry/2.0" in answer


@pytest.mark.parametrize("request_bytes, status", [
    (b"CONNECT pypi.org:443 HTTP/1.1\r\n\r\n", b"403"),  # any other host
    (b"CONNECT us-central1-docker.pkg.dev:80 HTTP/1.1\r\n\r\n", b"403"),  # another port
    (b"CONNECT 127.0.0.1:22 HTTP/1.1\r\n\r\n", b"403"),  # this machine
    (b"CONNECT evil-docker.pkg.dev.attacker.example:443 HTTP/1.1\r\n\r\n", b"403"),
    (b"GET http://us-central1-docker.pkg.dev/v2/ HTTP/1.1\r\n\r\n", b"405"),  # not a tunnel
    (b"\x16\x03\x01\x02\x00garbage\r\n\r\n", b"400"),
    (b"CONNECT us-central1-docker.pkg.dev:443 HTTP/1.1\r\n" + b"X: y\r\n" * 200 + b"\r\n", b"431"),
])
def test_the_front_answers_anything_else_with_one_status_and_closes(registry, request_bytes, status):
    answer = ask(registry, request_bytes)
    assert answer.split(b" ")[1] == status, answer


def test_a_refused_host_is_said_once(registry):
    ask(registry, b"CONNECT example.org:443 HTTP/1.1\r\n\r\n")
    ask(registry, b"CONNECT example.org:443 HTTP/1.1\r\n\r\n")
    assert sum("example.org:443" in line for line in registry.said) == 1


def test_an_idle_client_stalls_nobody(registry):
    idle = front(registry)  # says nothing
    try:
        answers = []
        thread = threading.Thread(target=lambda: answers.append(ask(registry, b"CONNECT x.org:443 HTTP/1.1\r\n\r\n")))
        thread.start()
        thread.join(timeout=20)
        assert answers and answers[0].startswith(b"HTTP/1.1 403")
    finally:
        idle.close()


def test_the_registry_itself_listens_on_the_loopback_only(registry):
    context = ssl.create_default_context(cafile=str(registry.ca))
    with socket.create_connection(("127.0.0.1", registry.port), timeout=10) as raw:
        with context.wrap_socket(raw, server_hostname="127.0.0.1"):
            pass
    addresses = {info[4][0] for info in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)} - {"127.0.0.1"}
    for address in addresses:
        with pytest.raises(OSError):
            socket.create_connection((address, registry.port), timeout=3).close()
