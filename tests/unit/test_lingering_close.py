"""serving/server.py's lingering close, on a transport of our own: what it does when the client is
still there and when the client has already gone (CI once saw ENOTCONN from write_eof, after a
hostile client reset its connection, end up as a traceback in the server's log)."""

from __future__ import annotations

import errno

import pytest

from serving.server import _LingeringClose

pytestmark = pytest.mark.unit


class Transport:
    def __init__(self, eof_error: OSError | None = None):
        self.eof_error, self.calls = eof_error, []

    def is_closing(self) -> bool:
        return "close" in self.calls

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        self.calls.append("write_eof")
        if self.eof_error:
            raise self.eof_error

    def resume_reading(self) -> None:
        self.calls.append("resume_reading")

    def close(self) -> None:
        self.calls.append("close")


class Loop:
    def __init__(self):
        self.timers = []

    def call_later(self, seconds, callback):
        self.timers.append((seconds, callback))
        return type("Timer", (), {"cancel": lambda self: None})()


def test_a_connected_client_gets_the_answer_whole_then_its_bytes_are_drained_until_the_deadline():
    transport, loop = Transport(), Loop()
    closing = _LingeringClose(transport, loop, seconds=5.0, budget=100)
    closing.close()
    assert transport.calls == ["write_eof", "resume_reading"] and closing.lingering and closing.is_closing()
    assert [seconds for seconds, _ in loop.timers] == [5.0]
    closing.drop(101)  # over the budget: closed at once
    assert transport.calls[-1] == "close"


@pytest.mark.parametrize("code", [errno.ENOTCONN, errno.EPIPE, errno.ECONNRESET])
def test_a_client_that_is_gone_is_closed_at_once_without_an_error(code):
    transport, loop = Transport(OSError(code, "gone")), Loop()
    closing = _LingeringClose(transport, loop, seconds=5.0, budget=100)
    closing.close()
    assert transport.calls == ["write_eof", "close"] and not closing.lingering and loop.timers == []
    closing.close()  # closed already: nothing more
    assert transport.calls == ["write_eof", "close"]
