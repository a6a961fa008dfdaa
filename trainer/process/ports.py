"""Free TCP ports on this machine: the one place that asks for them.

trainer.launch names one per task in TF_CONFIG; the rehearsal, the benchmarks and the tests start
servers on them. A port is free when it is handed out and may be taken by anyone once it is
closed again, so take it soon; ports asked for together are held open together, so they differ.

They come from below the kernel's ephemeral range (Linux: net.ipv4.ip_local_port_range), not
from it. Every outgoing connection on the machine takes its local port from that range, so a
port handed out from it can be taken by a connection (a gRPC channel, an HTTP request of another
process) in the seconds before the task's server binds it, and that task then never comes up.
Below the range only a server that binds the same port explicitly can take it. Where the range
cannot be read, or nothing below it is free, the kernel picks, as it did before.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
# Below this, the registered ports of common services (databases, proxies, development servers).
LOWEST = 10000
# Random tries per port below the range before the kernel picks: on a machine where that many are
# taken, the range below is not worth searching.
ATTEMPTS = 64


def ephemeral_range(path: Path = EPHEMERAL_RANGE) -> tuple[int, int] | None:
    """The kernel's (first, last) ephemeral port, or None where it cannot be read (not Linux)."""
    try:
        first, last = (int(word) for word in path.read_text().split())
    except (OSError, ValueError):
        return None
    return first, last


def _bound(host: str, port: int) -> socket.socket | None:
    sock = socket.socket()
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        return None
    return sock


def _held_port(host: str, below: range, rng: random.Random) -> socket.socket:
    """A socket bound to a free port: a random one of `below`, ATTEMPTS tries, else the kernel's."""
    for _ in range(ATTEMPTS if below else 0):
        sock = _bound(host, rng.choice(below))
        if sock is not None:
            return sock
    sock = _bound(host, 0)
    if sock is None:
        raise OSError(f"no free port on {host}")
    return sock


def free_ports(count: int, host: str = "127.0.0.1", *, path: Path = EPHEMERAL_RANGE,
               rng: random.Random | None = None) -> list[int]:
    """`count` distinct ports on `host`, each free when handed out, below the ephemeral range
    where it can be read (else the kernel's choice). They are held open together, so they differ."""
    span = ephemeral_range(path)
    below = range(LOWEST, span[0]) if span and span[0] > LOWEST else range(0)
    rng = rng or random.SystemRandom()
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            sockets.append(_held_port(host, below, rng))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def free_port(host: str = "127.0.0.1") -> int:
    """One free port on `host` (free_ports' rules)."""
    return free_ports(1, host)[0]
