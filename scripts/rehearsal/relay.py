"""Bytes between two connected sockets, both ways, until both sides are done: the tunnels of the
rehearsal's fronts (cloudbuild/registry.py, engine_front.py)."""

from __future__ import annotations

import socket
import threading


def copy(source: socket.socket, target: socket.socket) -> None:
    """source -> target until source ends (or either fails), then ends target's writing side."""
    try:
        while True:
            data = source.recv(65536)
            if not data:
                break
            target.sendall(data)
    except OSError:
        pass
    finally:
        try:
            target.shutdown(socket.SHUT_WR)
        except OSError:
            pass


def both_ways(client: socket.socket, backend: socket.socket) -> None:
    """Relays until the backend has ended its side: what the client sends after that has nowhere
    to go, so a client that keeps its socket open then (having read its answer) does not hold the
    relay's thread. The caller closes the sockets."""
    client.settimeout(None)
    backend.settimeout(None)
    forward = threading.Thread(target=copy, args=(client, backend), daemon=True)
    forward.start()
    copy(backend, client)
    try:
        client.shutdown(socket.SHUT_RD)  # ends the forward copy's wait for the client
    except OSError:
        pass
    forward.join()
