"""Cloud Storage for every container a rehearsal runs, Vertex replica and JobSet pod alike.

One setup per rehearsal, whichever platform's rules run the containers:
- a local Cloud Storage server (local_gcs/) holding every bucket the spec names and those
  `--stage` fills, reached with TensorFlow's own gs:// client through a proxy that listens on
  each job network's gateway and admits only that network (`for_network`);
- the same buckets as files (gcs_fuse.py), mounted once on this machine: Vertex replicas see
  them under /gcs/ as Cloud Storage FUSE shows them on Vertex, a JobSet pod where it mounts a
  Cloud Storage FUSE CSI volume (`bucket_directory`);
- or, with --real-gcs, Google's Cloud Storage with the user's Application Default Credentials,
  mounted where `gcloud ai custom-jobs local-run` mounts them;
- `keep` copies every object out before the server, which holds them in memory, stops.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from scripts.rehearsal import local_gcs
from scripts.rehearsal.runner import RehearsalError
from trainer import stopping

# Where gs:// objects of buckets the rehearsal does not hold come from: `{host}` is the Google host
# the job asked (public objects only, such as Keras' ImageNet weights).
PUBLIC_GCS = "https://{host}"
CA_IN_CONTAINER = "/etc/local-gcs/ca-bundle.pem"
CREDENTIALS_IN_CONTAINER = "/tmp/keys/cred_key.json"
GCS_FILES_IN_CONTAINER = "/gcs"
BUCKET_NAME = r"[a-z0-9][a-z0-9._-]{1,61}[a-z0-9]"
REPO = Path(__file__).resolve().parents[2]


class StorageError(RehearsalError):
    """An option the storage setup cannot honour; str() is one line."""


def buckets_named(spec: dict) -> list[str]:
    """Every bucket the spec mentions, as gs://BUCKET or /gcs/BUCKET."""
    text = json.dumps(spec)
    return sorted(set(re.findall(rf"(?:gs:/|/gcs)/({BUCKET_NAME})(?![a-z0-9._-])", text)))


def default_credentials(environ=os.environ) -> str:
    path = environ.get("GOOGLE_APPLICATION_CREDENTIALS") or os.path.join(
        os.path.expanduser("~"), ".config", "gcloud", "application_default_credentials.json")
    if not os.path.isfile(path):
        raise StorageError(f"--real-gcs needs Application Default Credentials; {path} does not exist "
                           "(run `gcloud auth application-default login`)")
    return path


def parse_stage(pair: str) -> tuple[Path, str, str]:
    """LOCAL=gs://BUCKET/PREFIX -> (local path, bucket, prefix)."""
    local, _, target = pair.partition("=")
    match = re.fullmatch(rf"gs://({BUCKET_NAME})/?(.*)", target)
    if not match or not os.path.exists(local):
        raise StorageError(f"--stage takes LOCAL_PATH=gs://BUCKET/PREFIX with an existing LOCAL_PATH; got {pair!r}")
    return Path(local), match.group(1), match.group(2).rstrip("/")


class Storage:
    """What every container of the rehearsal is given to reach Cloud Storage."""

    def __init__(self, scratch: Path, note: Callable[[str, str], None], *, real_gcs: bool = False,
                 allow_hosts=(), public_gcs: str | None = PUBLIC_GCS):
        self.scratch, self.note, self.real_gcs = Path(scratch), note, real_gcs
        self.allow_hosts, self.public_gcs = tuple(allow_hosts), public_gcs
        self.server: local_gcs.LocalGCS | None = None
        self.fuse: subprocess.Popen | None = None
        self.credentials: str | None = None
        self.buckets: list[str] = []

    @property
    def files(self) -> Path:
        return self.scratch / "gcs-files"

    def start(self, buckets: list[str], stages=()) -> "Storage":
        """Starts what the containers will reach. Raises StorageError for options it cannot honour."""
        if self.real_gcs:
            if stages:
                raise StorageError("--stage is for the local Cloud Storage server; with --real-gcs, copy with "
                                   "gcloud storage cp")
            self.credentials = default_credentials()
            return self
        staged = [parse_stage(pair) for pair in stages]  # every pair checked before anything starts
        self.server = local_gcs.LocalGCS(self.scratch / "gcs", allowed_hosts=self.allow_hosts, upstream=self.public_gcs,
                                         log=lambda line: self.note(line, "WARNING")).start()
        self.buckets = sorted(set(buckets) | {bucket for _, bucket, _ in staged})
        for bucket in self.buckets:
            self.server.create_bucket(bucket)
        for local, bucket, prefix in staged:
            files = [local] if local.is_file() else sorted(p for p in local.rglob("*") if p.is_file())
            for path in files:
                relative = path.name if local.is_file() else path.relative_to(local).as_posix()
                self.server.upload(bucket, f"{prefix}/{relative}" if prefix else relative, path.read_bytes())
        self.fuse = self._mount()
        return self

    def describe(self) -> str:
        if self.real_gcs:
            return "Cloud Storage: Google's, with your Application Default Credentials"
        return f"Cloud Storage: a local server holding {', '.join(f'gs://{b}' for b in self.buckets) or 'no bucket'}"

    def for_network(self, subnet: str, gateway: str) -> tuple[dict[str, str], list[str]]:
        """(variables, -v arguments) for every container on a job network: the proxy on the
        network's gateway (this machine, as the network sees it), which admits that network's
        addresses and nothing wider; the CA bundle; the buckets as files under /gcs/."""
        if self.real_gcs:
            return ({"GOOGLE_APPLICATION_CREDENTIALS": CREDENTIALS_IN_CONTAINER},
                    [f"{self.credentials}:{CREDENTIALS_IN_CONTAINER}:ro"])
        proxy = self.server.serve_network(subnet, gateway)
        env = {"https_proxy": proxy, "HTTPS_PROXY": proxy, **local_gcs.ca_variables(CA_IN_CONTAINER),
               "GOOGLE_AUTH_TOKEN_FOR_TESTING": "local-gcs", "NO_GCE_CHECK": "true"}
        return env, [f"{self.server.ca}:{CA_IN_CONTAINER}:ro"]

    def files_volume(self) -> str | None:
        """The -v argument that shows every bucket under /gcs/ (Vertex), or None without FUSE."""
        return f"{self.files}:{GCS_FILES_IN_CONTAINER}" if self.fuse is not None else None

    def bucket_directory(self, bucket: str) -> Path:
        """One bucket as files, for a pod's Cloud Storage FUSE CSI volume; "_" (the driver's dynamic
        mounting) is every bucket, each a directory, as under /gcs/ on Vertex."""
        if self.fuse is None:
            raise StorageError(f"a Cloud Storage FUSE volume of gs://{bucket} needs the local server's files, "
                               "which this machine cannot mount (see the warning above), or --real-gcs is set")
        if bucket == "_":
            return self.files
        if bucket not in self.buckets:
            self.server.create_bucket(bucket)
            self.buckets.append(bucket)
        return self.files / bucket

    def copy(self, bucket: str, prefix: str, to_bucket: str, to_prefix: str) -> int:
        """Copies every object under gs://bucket/prefix/ to gs://to_bucket/to_prefix/; how many."""
        self.server.create_bucket(to_bucket)
        if to_bucket not in self.buckets:
            self.buckets.append(to_bucket)
        names = [name for name in self.server.list(bucket, prefix + "/") if not name.endswith("/")]
        for name in names:
            self.server.upload(to_bucket, f"{to_prefix}/{name[len(prefix) + 1:]}", self.server.download(bucket, name))
        return len(names)

    def keep(self, directory: Path) -> int:
        """Copies every object out of the local server, which keeps them only in memory."""
        count = 0
        for bucket in self.buckets:
            for name in self.server.list(bucket):
                if name.endswith("/"):
                    (directory / bucket / name).mkdir(parents=True, exist_ok=True)
                    continue
                path = directory / bucket / name
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(self.server.download(bucket, name))
                count += 1
        return count

    def close(self) -> None:
        if self.fuse is not None:
            subprocess.run(["fusermount3", "-u", "-z", str(self.files)], capture_output=True)
            stopping.wait_or_kill([self.fuse], 10)  # unmounted, the server exits by itself
            self.fuse = None
        if self.server is not None:
            self.server.stop()
            self.server = None

    def _mount(self) -> subprocess.Popen | None:
        """The server's buckets as files (gcs_fuse.py), or None, said once, where FUSE is missing."""
        missing = [what for what, there in (("/dev/fuse", os.path.exists("/dev/fuse")),
                                            ("fusermount3 (Debian: fuse3)", shutil.which("fusermount3")))
                   if not there]
        try:
            import mfusepy  # noqa: F401
        except (ImportError, OSError) as error:
            missing.append(f"mfusepy ({error})")
        if missing:
            self.note(f"no /gcs/ in the containers: this machine lacks {', '.join(missing)}; gs:// works", "WARNING")
            return None
        from scripts.rehearsal.gcs_fuse import others_may_enter

        if not others_may_enter():
            self.note("/gcs/ admits only this machine's user, not an image's own (uid 1000): add user_allow_other "
                      "to /etc/fuse.conf", "WARNING")
        self.files.mkdir(parents=True)
        log = self.files.with_suffix(".log")
        with open(log, "wb") as sink:
            process = subprocess.Popen([sys.executable, "-m", "scripts.rehearsal.gcs_fuse", "--api",
                                        f"http://127.0.0.1:{self.server.backend_port}", str(self.files)],
                                       cwd=REPO, stdout=sink, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while not os.path.ismount(self.files):
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                process.wait()
                lines = log.read_text(errors="replace").strip().splitlines()
                raise StorageError(f"could not mount the buckets under {self.files}: {lines[-1] if lines else 'no output'}")
            time.sleep(0.1)
        return process
