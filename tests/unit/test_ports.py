"""trainer.process.ports: free ports from below the kernel's ephemeral range, where outgoing
connections never take their local ports, and the kernel's own choice where that range is unknown."""

from __future__ import annotations

import random
import socket

from trainer.process import ports


def range_file(tmp_path, text: str):
    path = tmp_path / "ip_local_port_range"
    path.write_text(text)
    return path


def test_ports_come_from_below_the_ephemeral_range_distinct_and_free(tmp_path):
    path = range_file(tmp_path, "32768\t60999\n")
    handed = ports.free_ports(8, path=path)
    assert len(set(handed)) == 8
    assert all(ports.LOWEST <= port < 32768 for port in handed), handed
    for port in handed:  # each free once handed out: a server can bind it
        with socket.socket() as server:
            server.bind(("127.0.0.1", port))


class Scripted(random.Random):
    """Picks the given ports in turn, then the last one for ever."""

    def __init__(self, *picks: int):
        super().__init__(0)
        self.picks = list(picks)

    def choice(self, seq):
        assert all(pick in seq for pick in self.picks)
        return self.picks.pop(0) if len(self.picks) > 1 else self.picks[0]


def test_a_taken_port_is_passed_over_and_after_many_taken_ones_the_kernel_picks(tmp_path):
    path = range_file(tmp_path, "32768 60999")
    other = ports.free_ports(1, path=path)[0]
    with socket.socket() as server:
        server.bind(("127.0.0.1", ports.free_ports(1, path=path)[0]))
        server.listen()
        taken = server.getsockname()[1]
        assert ports.free_ports(1, path=path, rng=Scripted(taken, other)) == [other]
        # Every try meets the taken port: the kernel's choice, from its ephemeral range.
        handed = ports.free_ports(1, path=path, rng=Scripted(taken))
    first, last = ports.ephemeral_range()
    assert handed != [taken] and first <= handed[0] <= last


def test_without_a_readable_range_the_kernel_picks(tmp_path):
    assert ports.ephemeral_range(tmp_path / "missing") is None
    assert ports.ephemeral_range(range_file(tmp_path, "not numbers")) is None
    handed = ports.free_ports(3, path=tmp_path / "missing")
    assert len(set(handed)) == 3 and all(port > 0 for port in handed)


def test_a_range_that_leaves_nothing_below_has_the_kernel_pick(tmp_path):
    handed = ports.free_ports(2, path=range_file(tmp_path, f"{ports.LOWEST} 60999"))
    assert len(set(handed)) == 2
    span = ports.ephemeral_range()  # the kernel picks from its own range (Linux)
    assert all(span[0] <= port <= span[1] for port in handed) if span else all(port > 0 for port in handed)


def test_this_machines_range_is_read():
    span = ports.ephemeral_range()
    if span is not None:  # Linux
        first, last = span
        assert 0 < first <= last <= 65535
        assert all(port < first for port in ports.free_ports(4)) or first <= ports.LOWEST
