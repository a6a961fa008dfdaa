"""scripts/rehearsal/engine_front.py: the Docker API front that waits for containers through
podman's own endpoint. Here against a stand-in engine on a socket of the test's (threads, no
process); the container tier's test_engine_front_podman.py runs it in front of podman itself."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import socketserver
import stat
import struct
import threading
import time

import pytest

from scripts.rehearsal import engine_front

pytestmark = pytest.mark.unit


class StandIn(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    """An engine that records each request's head and answers with `answer(head)`."""

    daemon_threads = True

    def __init__(self, path: str, answer):
        self.heads: list[str] = []
        self.answer = answer
        super().__init__(path, StandInConnection)


class StandInConnection(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = self.request.recv(65536)
            if not chunk:
                return
            data += chunk
        head = data.split(b"\r\n\r\n")[0].decode("latin-1")
        self.server.heads.append(head)
        self.request.sendall(self.server.answer(head))


def http(status: str, body: bytes, chunked: bool = False) -> bytes:
    if chunked:
        return (f"HTTP/1.1 {status}\r\nTransfer-Encoding: chunked\r\n\r\n{len(body):x}\r\n".encode() + body
                + b"\r\n0\r\n\r\n")
    return f"HTTP/1.1 {status}\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body


@contextlib.contextmanager
def serving(tmp_path, body: bytes = b'{"ok": true}'):
    """(front's socket path, the stand-in engine), both served until the block ends; the engine
    answers 200 with `body` unless a test sets its answer."""
    engine = StandIn(str(tmp_path / "engine.sock"), lambda head: http("200 OK", body))
    threading.Thread(target=engine.serve_forever, args=(0.05,), daemon=True).start()
    served = engine_front.Front(str(tmp_path / "front.sock"), str(tmp_path / "engine.sock"))
    threading.Thread(target=served.serve_forever, args=(0.05,), daemon=True).start()
    try:
        yield str(tmp_path / "front.sock"), engine
    finally:
        served.close()
        engine.shutdown()
        engine.server_close()


@pytest.fixture
def front(tmp_path):
    with serving(tmp_path) as pair:
        yield pair


def exchange(path: str, request: bytes, timeout: float = 10) -> bytes:
    with socket.socket(socket.AF_UNIX) as client:
        client.settimeout(timeout)
        client.connect(path)
        client.sendall(request)
        answer = b""
        while chunk := client.recv(65536):
            answer += chunk
        return answer


@pytest.mark.parametrize("target, expected", [
    ("/containers/abc/wait", "/v4.0.0/libpod/containers/abc/wait?condition=created&condition=stopped&condition=exited"
                             "&interval=100ms"),
    ("/v1.41/containers/abc/wait?condition=not-running", "/v4.0.0/libpod/containers/abc/wait?condition=created"
                                                         "&condition=stopped&condition=exited&interval=100ms"),
    ("/v1.41/containers/abc/wait?condition=next-exit", None),
    ("/v1.41/containers/abc/wait?condition=removed", None),
    ("/v1.41/containers/abc/json", None),
    ("/v1.41/containers/abc/wait/extra", None),
])
def test_only_a_wait_for_the_container_to_stop_running_goes_to_podmans_endpoint(target, expected):
    assert engine_front.rewrite_wait("POST", target) == expected
    assert engine_front.rewrite_wait("GET", target) is None


def test_podmans_exit_code_is_answered_in_the_docker_apis_form_and_its_errors_as_they_came():
    assert engine_front.docker_answer(200, b"3\n") == (200, b'{"StatusCode": 3, "Error": null}')
    assert engine_front.docker_answer(404, b'{"message": "no such container"}') == (404, b'{"message": "no such container"}')
    status, body = engine_front.docker_answer(200, b"not a number")
    assert status == 500 and "not a number" in json.loads(body)["message"]


@pytest.mark.parametrize("chunked", [False, True])
def test_a_wait_through_the_front_is_asked_of_podmans_endpoint_and_answered_as_docker_does(front, chunked):
    path, engine = front
    engine.answer = lambda head: http("200 OK", b"7\n", chunked)
    answer = exchange(path, b"POST /v1.41/containers/abc/wait HTTP/1.1\r\nHost: docker\r\n\r\n")
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK") and json.loads(body) == {"StatusCode": 7, "Error": None}
    assert engine.heads[0].splitlines()[0] == ("POST /v4.0.0/libpod/containers/abc/wait?condition=created&condition="
                                               "stopped&condition=exited&interval=100ms HTTP/1.1")


def test_a_missing_container_is_the_engines_404(front):
    path, engine = front
    engine.answer = lambda head: http("404 Not Found", b'{"message": "no such container"}')
    answer = exchange(path, b"POST /containers/gone/wait HTTP/1.1\r\nHost: docker\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 404 ") and answer.endswith(b'{"message": "no such container"}')


def test_any_other_request_passes_as_it_came_but_for_closing_the_connection_after_it(front):
    path, engine = front
    body = b'{"Image": "x"}'
    answer = exchange(path, b"POST /v1.41/containers/create HTTP/1.1\r\nHost: docker\r\nConnection: keep-alive\r\n"
                            b"Content-Length: %d\r\n\r\n" % len(body) + body)
    assert answer == http("200 OK", b'{"ok": true}')
    lines = engine.heads[0].split("\r\n")
    assert lines[0] == "POST /v1.41/containers/create HTTP/1.1"
    assert [line for line in lines if line.lower().startswith("connection:")] == ["Connection: close"]


def test_an_upgrade_keeps_its_connection_header(front):
    path, engine = front
    exchange(path, b"POST /v1.41/containers/abc/attach HTTP/1.1\r\nHost: docker\r\nConnection: Upgrade\r\n"
                   b"Upgrade: tcp\r\n\r\n")
    assert "Connection: Upgrade" in engine.heads[0].split("\r\n")


# --- from the side of a hostile client ---------------------------------------------------------


@pytest.mark.parametrize("request_bytes", [
    b"GARBAGE\r\n\r\n",
    b"GET / SPDY/3\r\n\r\n",
    b"GET / HTTP/1.1\r\n" + b"X-Filler: 1\r\n" * (engine_front.HEADER_LINES + 1) + b"\r\n",
    b"GET /" + b"a" * (engine_front.LINE_BYTES + 10) + b" HTTP/1.1\r\n\r\n",
], ids=["not-http", "not-http-1", "too-many-headers", "line-too-long"])
def test_a_malformed_request_is_one_400_and_never_reaches_the_engine(front, request_bytes):
    path, engine = front
    answer = exchange(path, request_bytes)
    assert answer.startswith(b"HTTP/1.1 400 ")
    assert engine.heads == []


def test_a_client_that_stalls_mid_head_is_closed_and_never_reaches_the_engine(front, monkeypatch):
    monkeypatch.setattr(engine_front, "READ_TIMEOUT_SECONDS", 0.3)
    path, engine = front
    started = time.monotonic()
    answer = exchange(path, b"GET /_ping HTTP/1.1\r\nHost: d", timeout=10)
    assert answer.startswith(b"HTTP/1.1 400 ") and time.monotonic() - started < 10
    assert engine.heads == []


def answered(path: str) -> bytes:
    """A ping's answer; b"" where the front closed the connection (reset, as it left it unread)."""
    try:
        return exchange(path, b"GET /_ping HTTP/1.1\r\nHost: d\r\n\r\n")
    except (ConnectionResetError, BrokenPipeError):
        return b""


def slot_comes_back(path: str) -> bool:
    """Whether a ping is answered within 5 s, as the front's slots come back."""
    for _ in range(50):
        if answered(path):
            return True
        time.sleep(0.1)
    return False


def test_connections_beyond_the_limit_are_closed_unread(tmp_path, monkeypatch):
    monkeypatch.setattr(engine_front, "MAX_CONNECTIONS", 2)
    idle = [socket.socket(socket.AF_UNIX) for _ in range(2)]
    with serving(tmp_path, b"{}") as (path, engine):
        try:
            for connection in idle:
                connection.connect(path)
            time.sleep(0.2)  # both taken by the front's threads
            assert answered(path) == b""
            assert engine.heads == []
            for connection in idle:
                connection.close()
            assert slot_comes_back(path), "no slot came back"
        finally:
            for connection in idle:
                connection.close()
    assert engine.heads and engine.heads[-1].startswith("GET /_ping")


def test_a_client_that_keeps_its_socket_open_after_its_answer_gives_its_slot_back(tmp_path, monkeypatch):
    monkeypatch.setattr(engine_front, "MAX_CONNECTIONS", 1)
    lingering = socket.socket(socket.AF_UNIX)
    with serving(tmp_path, b"{}") as (path, _):
        try:
            lingering.settimeout(10)
            lingering.connect(path)
            lingering.sendall(b"GET /_ping HTTP/1.1\r\nHost: d\r\n\r\n")
            answer = b""
            while chunk := lingering.recv(65536):  # to the end the engine gave it; the socket stays open
                answer += chunk
            assert answer == http("200 OK", b"{}")
            assert slot_comes_back(path), "the one slot stayed with a client that had its answer"
        finally:
            lingering.close()


def test_the_socket_is_its_owners_alone_and_another_user_is_refused_unread(front):
    path, _ = front
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600

    class Peer:
        def __init__(self, uid: int):
            self.uid = uid

        def getsockopt(self, *args):
            return struct.pack("3i", 1, self.uid, self.uid)

    served = engine_front.Front.__new__(engine_front.Front)
    served.slots = threading.BoundedSemaphore(1)
    stranger = 4242 if os.getuid() != 4242 else 4343
    assert served.verify_request(Peer(stranger), None) is False
    assert served.verify_request(Peer(os.getuid()), None) is True
