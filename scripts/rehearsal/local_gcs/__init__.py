"""A local Cloud Storage server that TensorFlow's own gs:// client talks to unchanged.

    python -m scripts.rehearsal.local_gcs [--root DIR] [--bucket NAME ...] [--latency-ms MS]

prints the environment to export in another shell, then serves until Ctrl-C. The tests use the
same class (`LocalGCS`) through a pytest fixture.

Why it is more than fake-gcs-server alone:
- TensorFlow's client has no setting for its endpoint: it calls https://www.googleapis.com and
  https://storage.googleapis.com, verifying TLS against `CURL_CA_BUNDLE`. So processes get
  `https_proxy` pointing at `Front`, a CONNECT proxy that answers for those two hosts with a
  certificate from a CA made here. (A container can map the hostnames to `Front` with
  --add-host instead: it takes TLS directly as well.) What else it tunnels is its caller's
  choice: nothing for a rehearsal's containers (storage.py), anything for the processes of
  this machine that the command line serves (they reach the network anyway).
- TensorFlow sends `Transfer-Encoding: identity` with uploads; Go's HTTP server (fake-gcs-server)
  answers 501. Real Cloud Storage ignores the header, and so does `Front`: it forwards each
  request with a plain Content-Length.
- fake-gcs-server runs on plain http behind `Front`, and builds the upload URL it returns from
  that scheme: `Front` turns it back into https.
- fake-gcs-server v1.54 lacks `GET /storage/v1/b/BUCKET/storageLayout`, which TensorFlow asks
  before renaming a directory; `Front` answers it as a bucket without hierarchical namespace.
- Tests need the faults Cloud Storage has and fake-gcs-server does not: error statuses and the
  time to first byte. `Front` injects them (`fail`, `latency_seconds`) and lets a test act at
  the moment a given request arrives (`on_request`), to kill a writer mid-write.

Objects are kept in fake-gcs-server's memory backend, gone when it stops. Its filesystem backend
(v1.54) loses the `dir/` placeholder objects that makedirs writes (`isdir` turns false, and
renaming such a directory fails with 404); Cloud Storage keeps them.

| module      | its one job                                                                  |
|-------------|------------------------------------------------------------------------------|
| launcher.py | `LocalGCS`: starts fake-gcs-server and the front, creates buckets, stops both |
| front.py    | `Front`: the CONNECT proxy and TLS endpoint, what it admits and forwards      |
| ca.py       | the local CA and the certificate for Google's hosts; what makes a client trust it |
| faults.py   | `Fault`: an error status or a test's hook at a given request                  |
| __main__.py | the command line (`python -m scripts.rehearsal.local_gcs`)                   |
"""

from scripts.rehearsal.local_gcs.ca import GOOGLE_HOSTS, ca_variables
from scripts.rehearsal.local_gcs.faults import Fault
from scripts.rehearsal.local_gcs.launcher import LocalGCS

__all__ = ["GOOGLE_HOSTS", "Fault", "LocalGCS", "ca_variables"]
