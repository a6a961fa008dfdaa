"""Free TCP ports on this machine: the one place that asks the kernel for them.

trainer.launch names one per task in TF_CONFIG; the rehearsal, the benchmarks and the tests start
servers on them. A port is free when it is handed out and may be taken by anyone once it is
closed again, so take it soon; ports asked for together are held open together, so they differ.
"""

from __future__ import annotations

import socket


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """`count` distinct ports the kernel just handed out on `host`."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind((host, 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def free_port(host: str = "127.0.0.1") -> int:
    """One port the kernel just handed out on `host`."""
    return free_ports(1, host)[0]
