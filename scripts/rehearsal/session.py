"""One rehearsal from start to end, whatever the platform: `rehearse` checks the options, and
`run_session` finds the engine, starts Cloud Storage (storage.py), hands the spec to the
platform's rules (vertex.py, jobset/, trainjob/, endpoint.py) over the runner (runner.py), copies the
buckets out, and removes everything it made, also when it is interrupted. Signals are handled here
and nowhere else (a Cloud Build rehearsal takes `stop_on_signals` from here): Ctrl-C and SIGTERM
(a CI runner's cancel, `kill`) both stop every container with its grace, then clean up.

`leftovers` lists what a rehearsal left on this machine: every test of the rehearsal asserts it
is empty after its run.

The command ends 0 when the job succeeds; with the exit code of the container whose failure ended
it otherwise (124 when a time limit did); 125 when the engine could not run a container; 130
when interrupted; 2, with one line, for a spec or an option it cannot run.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import re
import secrets
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from scripts.rehearsal import jobset, trainjob, vertex
from scripts.rehearsal.engine import Engine, EngineError
from scripts.rehearsal.runner import PREFIX, Output, RehearsalError, Session
from scripts.rehearsal.storage import PUBLIC_GCS, Storage, buckets_named

VERTEX, JOBSET, TRAINJOB = "vertex", "jobset", "trainjob"


@dataclasses.dataclass(frozen=True)
class Options:
    engine: str | None = None  # docker or podman; None: docker if its daemon answers, else podman
    real_gcs: bool = False
    stages: tuple[str, ...] = ()  # LOCAL=gs://BUCKET/PREFIX
    keep_dir: str | None = None
    allow_hosts: tuple[str, ...] = ()
    public_gcs: str | None = PUBLIC_GCS
    preempt: tuple[str, ...] = ()
    maintenance: tuple[str, ...] = ()  # Vertex only
    vertex: vertex.Options = vertex.Options()


def faults_of(platform: str, options: Options) -> list:
    if platform in (JOBSET, TRAINJOB):
        if options.maintenance:
            raise RehearsalError("--maintenance is VM maintenance on Vertex AI; a JobSet's pods are evicted with --preempt")
        return [jobset.parse_eviction(text) for text in options.preempt]
    return ([vertex.parse_preemption(text) for text in options.preempt]
            + [vertex.parse_preemption(text, vertex.MAINTENANCE) for text in options.maintenance])


def rehearse(platform: str, document: dict, options: Options, output: Output | None = None) -> int:
    """Runs a CustomJob / HyperparameterTuningJob (vertex), a JobSet (jobset) or a TrainJob built
    into its JobSet (trainjob: a trainjob.Built) on this machine; returns the exit code. Raises
    RehearsalError, one line, for what it cannot run."""
    faults = faults_of(platform, options)
    if options.vertex.replica_restarts < 0 or options.vertex.job_retries < 0:
        raise RehearsalError("--replica-restarts and --job-retries are 0 or more")
    {JOBSET: jobset, TRAINJOB: trainjob}.get(platform, vertex).check(document, faults)  # before anything starts

    def play(session: Session, storage: Storage, run_id: str, scratch: Path) -> int:
        buckets = None if options.real_gcs else storage.bucket_directory
        if platform == JOBSET:
            return jobset.run(session, document, run_id, faults, buckets)
        if platform == TRAINJOB:
            return trainjob.run(session, document, run_id, faults, buckets)
        return vertex.run(session, document, run_id, faults, storage.files_volume(), options.vertex, scratch)

    return run_session(options, buckets_named(document.jobset if platform == TRAINJOB else document), play, output)


_last_run_id = 0
_run_id_lock = threading.Lock()


def new_run_id() -> str:
    """A session's id, in its network's and containers' names and as Vertex AI's CLOUD_ML_JOB_ID:
    milliseconds, then six random digits (19 digits, like a Vertex AI job's numeric id). Two
    sessions started in one millisecond (a test's examples run side by side) must not share a
    network, and the milliseconds alone once gave them one. In one process every id is above the
    last, so none repeats (random digits alone met twice in 2000 ids drawn within a few
    milliseconds); across processes the random digits make a repeat a one-in-a-million chance
    for two sessions started in the same millisecond."""
    global _last_run_id
    drawn = int(time.time() * 1000) * 10**6 + secrets.randbelow(10**6)
    with _run_id_lock:
        _last_run_id = max(drawn, _last_run_id + 1)
        return str(_last_run_id)


def run_session(options: Options, buckets: list[str], play, output: Output | None = None) -> int:
    """Finds the engine, starts Cloud Storage with `buckets` (and --stage's), runs
    play(session, storage, run_id, scratch), copies the buckets out (--keep), and removes
    everything, also when interrupted. Returns play's exit code (130 when interrupted)."""
    output = output or Output()
    try:
        engine = Engine.detect(options.engine)
    except EngineError as error:
        raise RehearsalError(str(error)) from None
    run_id = new_run_id()
    scratch = Path(tempfile.mkdtemp(prefix=PREFIX))
    storage = Storage(scratch, output.note, real_gcs=options.real_gcs, allow_hosts=options.allow_hosts,
                      public_gcs=options.public_gcs)
    session = Session(engine, output, storage.for_network)
    previous_handlers = _interrupt_on_signals()
    try:
        storage.start(buckets, options.stages)
        output.note(storage.describe())
        code = play(session, storage, run_id, scratch)
        if options.keep_dir and not options.real_gcs:
            count = storage.keep(Path(options.keep_dir))
            output.note(f"copied {count} objects from the local Cloud Storage server to {options.keep_dir}")
        return code
    except KeyboardInterrupt:
        output.note("interrupted: stopping and removing the job's containers and networks", "WARNING")
        return 130
    finally:
        if previous_handlers is not None:  # a second Ctrl-C must not cut the cleanup short
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        session.cancel()
        session.remove_all()  # whatever an interrupted run made after it was told to stop
        storage.close()
        shutil.rmtree(scratch, ignore_errors=True)
        if previous_handlers is not None:
            for signum, handler in previous_handlers.items():
                signal.signal(signum, handler)


def _interrupt_on_signals() -> dict | None:
    """Ctrl-C and SIGTERM both interrupt the run, which then cleans up; returns the handlers to
    restore. Signals reach only the main thread: elsewhere, None."""
    if threading.current_thread() is not threading.main_thread():
        return None
    previous = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    for signum in previous:
        signal.signal(signum, _interrupt)
    return previous


def _interrupt(*_) -> None:
    raise KeyboardInterrupt


def stop_on_signals() -> dict | None:
    """The first Ctrl-C or SIGTERM raises KeyboardInterrupt in the main thread: an orderly stop,
    each container given its grace, then everything removed (a Cloud Build rehearsal's). Any later one is ignored, so a second Ctrl-C
    or a CI runner's repeated SIGTERM cannot cut that cleanup short (run_session's rule, applied from
    the first signal on). Returns the handlers to restore; None off the main thread, where signals
    never arrive."""
    if threading.current_thread() is not threading.main_thread():
        return None
    previous = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}

    def stop(*_) -> None:
        for signum in previous:
            signal.signal(signum, signal.SIG_IGN)
        raise KeyboardInterrupt

    for signum in previous:
        signal.signal(signum, stop)
    return previous


def leftovers(engine: Engine, parent: int | None = None) -> list[str]:
    """What rehearsals left on this machine: containers, networks and volumes (a Cloud Build
    rehearsal's steps `rehearsal-cloudbuild-ID-step-N`, their network and `-home` volume among
    them), a Cloud Build rehearsal's own tags of the images it built (REGION-docker.pkg.dev/
    local-project/...), FUSE mounts, the processes that outlived their runner (`parent`: a process
    whose own children do not count, such as a test session's servers): Cloud Storage servers, FUSE,
    and a Cloud Build rehearsal's registry and engine API service, and scratch directories (which
    hold the local CA's key)."""
    from scripts.rehearsal.cloudbuild.build import LOCAL_PROJECT, MADE_BY_A_STEP  # here: that module imports this one

    left = []
    for listing in (("ps", "-a"), ("network", "ls"), ("volume", "ls")):
        names = engine(*listing, "--format", "{{.Name}}" if listing[0] != "ps" else "{{.Names}}", check=False).split()
        left += [name for name in names if name.startswith(PREFIX)]
    # What a Cloud Build step made through its build's engine service, named at random.
    left += [f"container {name} (made by a step of build {PREFIX}cloudbuild-{build[:8]})"
             for name, build in engine.annotated_containers(MADE_BY_A_STEP).items()]
    images = engine.image_names()
    left += [f"image {name}" for name in images if re.match(rf"[a-z0-9-]+-docker\.pkg\.dev/{LOCAL_PROJECT}/", name)]
    with open("/proc/mounts") as mounts:
        left += [f"mount {line.split()[1]}" for line in mounts if f"/{PREFIX}" in line.split()[1]]
    processes = subprocess.run(["ps", "-eo", "pid=,ppid=,args="], capture_output=True, text=True).stdout.splitlines()
    for pid, ppid, args in (line.split(None, 2) for line in processes if len(line.split(None, 2)) == 3):
        # The Cloud Build rehearsal's docker-registry and `podman system service` are known by the
        # scratch directory their arguments name.
        ours = "fake-gcs-server" in args or "rehearsal.gcs_fuse" in args or (
            ("docker-registry" in args or "system service" in args) and f"/{PREFIX}" in args)
        if ours and int(ppid) != (parent or -1) and int(pid) != os.getpid():
            left.append(f"process {args}")
    left += [f"directory {path}" for path in glob.glob(os.path.join(tempfile.gettempdir(), f"{PREFIX}*"))]
    return left
