"""A front for podman's Docker-compatible API socket that waits for containers without podman's
busy loop.

podman before 4.5 answers the Docker API's `POST /containers/ID/wait` by checking the container's
state with a 1 ns interval until it stops (containers/podman#18150, fixed in 4.5 by #18149);
Debian 12 ships 4.3. Measured here, podman 4.3.1 on the 2-core Xeon: a wait on a container that
sleeps 4 s cost the service 5.0 CPU s, the same wait through podman's own endpoint 0.06.
container-structure-test waits on the container of every command test, so each structure test run
spun a core for as long as its tests ran, beside the tests themselves.

The front passes every request to the engine's socket as it came, but for two changes:
- One request per connection: `Connection: close` is added to each (unless it asks to upgrade the
  connection, as attach and exec do), so the engine closes after its answer, the client sends its
  next request on a new connection, and the front reads every request's head.
- A wait for the container to stop running (the Docker API's default condition, `not-running`)
  is asked of podman's own endpoint, `/libpod/containers/ID/wait`, for the states that are not
  running (created, stopped, exited), polling every 100 ms; the exit code it gives is answered in
  the Docker API's form, `{"StatusCode": N, "Error": null}`, and its errors as they are. A wait for
  `next-exit` or `removed` passes unchanged.

Admitted before a byte is read: the socket is made with mode 0600, and a peer whose user
(SO_PEERCRED) is neither this process's nor root is closed. A client has 30 s to send its
request's head, of at most 100 lines of 8 kB each; at most 64 connections are served at once.

    python -m scripts.rehearsal.engine_front LISTEN_SOCKET ENGINE_SOCKET   (until SIGTERM)
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import socketserver
import struct
import sys
import threading
import urllib.parse

from scripts.rehearsal import relay

LINE_BYTES = 8192
HEADER_LINES = 100
READ_TIMEOUT_SECONDS = 30
MAX_CONNECTIONS = 64
POLL_INTERVAL = "100ms"
# podman's states that are not running: the Docker API's `not-running`.
NOT_RUNNING = ("created", "stopped", "exited")
WAIT = re.compile(r"^(?:/v[0-9.]+)?/containers/([^/?]+)/wait(?:\?(.*))?$")


def rewrite_wait(method: str, target: str) -> str | None:
    """A Docker API wait for the container to stop running -> podman's own endpoint for it; None
    for any other request (another condition, another path)."""
    match = WAIT.match(target)
    if method != "POST" or not match:
        return None
    condition = urllib.parse.parse_qs(match.group(2) or "").get("condition", ["not-running"])
    if condition != ["not-running"]:
        return None
    query = urllib.parse.urlencode([("condition", state) for state in NOT_RUNNING] + [("interval", POLL_INTERVAL)])
    return f"/v4.0.0/libpod/containers/{match.group(1)}/wait?{query}"


def docker_answer(status: int, body: bytes) -> tuple[int, bytes]:
    """podman's wait answer -> the Docker API's: the exit code as StatusCode; an error as it came."""
    if status != 200:
        return status, body
    try:
        code = int(json.loads(body))
    except ValueError:
        return 500, json.dumps({"message": f"the engine's wait answered {body[:200]!r}"}).encode()
    return 200, json.dumps({"StatusCode": code, "Error": None}).encode()


def read_head(connection: socket.socket) -> tuple[bytes, bytes] | None:
    """(the request's head up to its blank line, what was read after it); None if the client
    closed, stalled or sent more than HEADER_LINES lines of LINE_BYTES."""
    data = b""
    while b"\r\n\r\n" not in data:
        if len(data) > LINE_BYTES * (HEADER_LINES + 1) or data.count(b"\r\n") > HEADER_LINES:
            return None
        try:
            chunk = connection.recv(LINE_BYTES)
        except OSError:
            return None
        if not chunk:
            return None
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    if len(lines) > HEADER_LINES + 1 or any(len(line) > LINE_BYTES for line in lines):
        return None
    return head, rest


def read_response(connection: socket.socket) -> tuple[int, bytes]:
    """An HTTP/1.1 answer read to the connection's end: (status, body, de-chunked if it was)."""
    data = b""
    while chunk := connection.recv(65536):
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    if any(line.lower().replace(" ", "") == "transfer-encoding:chunked" for line in lines[1:]):
        decoded = b""
        while body:
            size_line, _, body = body.partition(b"\r\n")
            size = int(size_line.split(b";")[0], 16)
            if size == 0:
                break
            decoded, body = decoded + body[:size], body[size + 2:]
        body = decoded
    return status, body


def reply(connection: socket.socket, status: int, body: bytes) -> None:
    reason = {200: "OK", 400: "Bad Request", 404: "Not Found", 500: "Internal Server Error",
              502: "Bad Gateway"}.get(status, "Error")
    connection.sendall(f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
                       f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)


class Front(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True

    def __init__(self, listen: str, engine: str):
        self.engine = engine
        self.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        old_mask = os.umask(0o177)  # the socket file is made 0600
        try:
            super().__init__(listen, _Connection)
        finally:
            os.umask(old_mask)

    def verify_request(self, request, client_address) -> bool:
        # Admitted before a byte is read: this process's user, or root.
        uid = struct.unpack("3i", request.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))[1]
        if uid not in (os.getuid(), 0) or not self.slots.acquire(blocking=False):
            return False
        return True

    def process_request_thread(self, request, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()

    def close(self) -> None:
        self.shutdown()
        self.server_close()
        try:
            os.unlink(self.server_address)
        except OSError:
            pass


class _Connection(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        client: socket.socket = self.request
        client.settimeout(READ_TIMEOUT_SECONDS)
        read = read_head(client)
        if read is None:
            return reply(client, 400, b'{"message": "the front reads one request head of at most 100 lines of 8 kB"}')
        head, rest = read
        request_line, *headers = head.split(b"\r\n")
        parts = request_line.decode("latin-1").split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            return reply(client, 400, b'{"message": "not an HTTP/1 request"}')
        method, target, version = parts
        engine = socket.socket(socket.AF_UNIX)
        try:
            engine.connect(self.server.engine)
        except OSError:
            engine.close()
            return reply(client, 502, b'{"message": "the engine\'s API service does not answer"}')
        with engine:
            libpod = rewrite_wait(method, target)
            if libpod is not None:
                engine.sendall(f"POST {libpod} HTTP/1.1\r\nHost: d\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                               .encode())
                client.settimeout(None)
                try:
                    status, body = read_response(engine)
                except (OSError, ValueError, IndexError):
                    return reply(client, 502, b'{"message": "the engine\'s wait gave no answer"}')
                return reply(client, *docker_answer(status, body))
            upgrade = any(line.lower().startswith(b"upgrade:") for line in headers)
            if not upgrade:
                headers = [line for line in headers if not line.lower().startswith(b"connection:")]
                headers.append(b"Connection: close")
            engine.sendall(b"\r\n".join([f"{method} {target} {version}".encode("latin-1"), *headers]) + b"\r\n\r\n"
                           + rest)
            relay.both_ways(client, engine)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m scripts.rehearsal.engine_front LISTEN_SOCKET ENGINE_SOCKET", file=sys.stderr)
        return 2
    front = Front(argv[0], argv[1])
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=front.shutdown).start())
    try:
        front.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        front.server_close()
        try:
            os.unlink(argv[0])
        except OSError:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
