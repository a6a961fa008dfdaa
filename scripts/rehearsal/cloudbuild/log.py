"""The build's log as Cloud Build writes it: every line of a step prefixed with the step
(`Step #3 - "scan-gate-tf-runtime-cpu": ...`, `Step #3: ...` for a step without an id), the build's
own lines (`Starting Step #3 - "..."`, `Finished Step #3 - "..."`, `PUSH`, `DONE`, `ERROR`, `ERROR:
build step 3 "IMAGE" failed: step exited with non-zero status: 1`) bare. The formats are
cloud-build-local's build.go (stepIdentifier, timeAndRunStep, runStep, FailBuild) and what Cloud
Build's log shows (GoogleCloudPlatform/ai-on-gke#212 quotes a failed step's last lines). The
rehearsal's own lines start with `rehearsal:`, so they are never mistaken for Cloud Build's."""

from __future__ import annotations

import sys

from scripts.rehearsal.runner import Output


class BuildLog(Output):
    """The runner's Output, written as Cloud Build's log: a step's stdout and stderr alike."""

    def __init__(self, stream=sys.stdout):
        super().__init__(stream)

    def line(self, source: str, severity: str, text: str) -> None:
        with self.lock:
            self.stream.write(f"{source}: {text.rstrip()}\n" if source else f"{text.rstrip()}\n")
            self.stream.flush()

    def entry(self, text: str) -> None:
        """One of the build's own lines (Starting, Finished, PUSH, DONE, ERROR)."""
        self.line("", "INFO", text)

    def note(self, text: str, severity: str = "NOTICE") -> None:
        """What the rehearsal says of itself."""
        self.line("", severity, f"rehearsal: {text}")
