#!/usr/local/bin/python3
"""The Cloud Build rehearsal's `gcloud`: the three commands cloudbuild.yaml's steps run, answered
from files, and a one-line refusal of anything else.

- `gcloud artifacts docker images scan IMAGE [--remote] --location=L [--format=value(response.scan)]`:
  On-Demand Scanning of a local image. Refused, as gcloud refuses it, when the local-extract
  component is not installed; fails when the engine (the Docker API at /var/run/docker.sock) has
  no such image. Records the scan and prints its name (projects/P/locations/L/scans/ID).
- `gcloud artifacts docker images list-vulnerabilities SCAN --location=L --format=json`: the
  occurrences of the vulnerabilities file the rehearsal was given (On-Demand Scanning's
  `Occurrence`s, a JSON list; none by default) whose `resourceUri` names the scanned image (its
  last path component, without tag or digest), with `resourceUri` set to the scanned image.
- `gcloud artifacts sbom load --source=FILE --uri=URI`: checks that FILE is an SPDX or CycloneDX
  JSON document and URI an image by digest, and records the load (sbom-loads.jsonl).

State lives in CLOUDBUILD_STANDIN_STATE (a folder of the rehearsal, mounted into every step of
this image); the project is CLOUDSDK_CORE_PROJECT.
"""

import hashlib
import http.client
import json
import os
import socket
import sys
import urllib.parse
import uuid
from pathlib import Path

STATE = Path(os.environ.get("CLOUDBUILD_STANDIN_STATE", "/var/lib/cloudbuild-standin"))
LOCAL_EXTRACT = Path("/usr/lib/google-cloud-sdk/bin/local-extract")


class UnixConnection(http.client.HTTPConnection):
    def __init__(self, path):
        super().__init__("localhost")
        self.path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.connect(self.path)


def fail(command, message, code=1):
    print(f"ERROR: (gcloud.{command}) {message}", file=sys.stderr)
    return code


def flags(args):
    """(positionals, --name=value flags)."""
    positional, named, i = [], {}, 0
    while i < len(args):
        arg = args[i]
        if arg.startswith("--"):
            name, equals, value = arg[2:].partition("=")
            if not equals:
                if i + 1 < len(args) and not args[i + 1].startswith("--") and name not in ("remote", "async"):
                    value, i = args[i + 1], i + 1
                else:
                    value = "true"
            named[name] = value
        else:
            positional.append(arg)
        i += 1
    return positional, named


def image_name(reference):
    """The last path component of an image reference, without tag or digest."""
    name = reference.split("@", 1)[0]
    last = name.rsplit("/", 1)[-1]
    return last.split(":", 1)[0]


def scan(args):
    command = "artifacts.docker.images.scan"
    positional, named = flags(args)
    if len(positional) != 1:
        return fail(command, "expected one image to scan", 2)
    image, location = positional[0], named.get("location", "us")
    if named.get("remote") != "true":
        if not LOCAL_EXTRACT.exists():
            return fail(command, "scanning a local image needs the local-extract component: install "
                                 "google-cloud-cli-local-extract (apt-get) or run `gcloud components install local-extract`")
        connection = UnixConnection("/var/run/docker.sock")
        try:
            connection.request("GET", f"/images/{urllib.parse.quote(image, safe='')}/json")
            response = connection.getresponse()
            body = response.read()
        except OSError as error:
            return fail(command, f"cannot reach the Docker daemon at /var/run/docker.sock: {error}")
        if response.status != 200:
            return fail(command, f"image {image} was not found locally")
        digest = json.loads(body).get("Id", "")
    else:
        digest = ""
    project = os.environ.get("CLOUDSDK_CORE_PROJECT", "")
    name = f"projects/{project}/locations/{location}/scans/{uuid.uuid4()}"
    (STATE / "scans").mkdir(parents=True, exist_ok=True)
    (STATE / "scans" / f"{name.rsplit('/', 1)[-1]}.json").write_text(json.dumps({"image": image, "id": digest,
                                                                                  "location": location}))
    if named.get("format") == "value(response.scan)":
        print(name)
    else:
        print(json.dumps({"done": True, "response": {"scan": name}}, indent=2))
    return 0


def list_vulnerabilities(args):
    command = "artifacts.docker.images.list-vulnerabilities"
    positional, named = flags(args)
    if len(positional) != 1:
        return fail(command, "expected one scan", 2)
    record = STATE / "scans" / f"{positional[0].rsplit('/', 1)[-1]}.json"
    if not record.exists():
        return fail(command, f"NOT_FOUND: scan {positional[0]} was not found")
    scanned = json.loads(record.read_text())
    source = STATE / "vulnerabilities.json"
    occurrences = json.loads(source.read_text()) if source.exists() else []
    found = []
    for occurrence in occurrences:
        if image_name(str(occurrence.get("resourceUri", ""))) == image_name(scanned["image"]):
            found.append({**occurrence, "resourceUri": scanned["image"]})
    if named.get("format", "json") != "json":
        return fail(command, "the rehearsal's stand-in prints --format=json only", 2)
    print(json.dumps(found, indent=2))
    return 0


def sbom_load(args):
    command = "artifacts.sbom.load"
    _, named = flags(args)
    source, uri = named.get("source"), named.get("uri")
    if not source or not uri:
        return fail(command, "--source and --uri are required", 2)
    try:
        document = json.loads(Path(source).read_text())
    except (OSError, ValueError) as error:
        return fail(command, f"{source}: not a JSON SBOM ({error})")
    kind = "spdx" if "spdxVersion" in document else "cyclonedx" if document.get("bomFormat") == "CycloneDX" else None
    if kind is None:
        return fail(command, f"{source}: neither an SPDX nor a CycloneDX document")
    if "@sha256:" not in uri:
        return fail(command, f"--uri {uri}: an image by digest (IMAGE@sha256:...)")
    STATE.mkdir(parents=True, exist_ok=True)
    with open(STATE / "sbom-loads.jsonl", "a") as loads:
        loads.write(json.dumps({"uri": uri, "source": source, "format": kind,
                                "sha256": hashlib.sha256(Path(source).read_bytes()).hexdigest()}) + "\n")
    print(f"Loaded the {kind} SBOM {source} for {uri} (recorded by the Cloud Build rehearsal)")
    return 0


def main(argv):
    if argv[:4] == ["artifacts", "docker", "images", "scan"]:
        return scan(argv[4:])
    if argv[:4] == ["artifacts", "docker", "images", "list-vulnerabilities"]:
        return list_vulnerabilities(argv[4:])
    if argv[:3] == ["artifacts", "sbom", "load"]:
        return sbom_load(argv[3:])
    print("ERROR: (gcloud) the Cloud Build rehearsal's gcloud answers `artifacts docker images scan`, "
          f"`artifacts docker images list-vulnerabilities` and `artifacts sbom load` only, not: gcloud {' '.join(argv)}",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
