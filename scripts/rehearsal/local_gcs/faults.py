"""A fault the front injects: an error status, or a test's hook, at the requests it matches."""

from __future__ import annotations

import dataclasses
import re
from typing import Callable


@dataclasses.dataclass
class Fault:
    """Answer `status` instead of forwarding, `times` times, to requests whose method and
    path (with query) match. `status` None: run `action` (a test's hook) first; when it returns
    true and `drop` is set, close the connection unanswered (the client died mid-request),
    else forward the request."""

    status: int | None
    times: int
    method: str = ""
    path: str = ""  # a regular expression searched in the request's path and query
    action: Callable[[str, str], bool | None] | None = None  # called with (method, path)
    drop: bool = False
    seen: int = 0

    def matches(self, method: str, path: str) -> bool:
        return self.times > 0 and (not self.method or method == self.method) and re.search(self.path, path) is not None
