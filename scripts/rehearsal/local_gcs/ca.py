"""The local CA, a server certificate for Google's Cloud Storage hosts signed by it, and what makes
a client trust it."""

from __future__ import annotations

import ssl
from pathlib import Path

from scripts.rehearsal import tls

# The hosts TensorFlow's GCS client calls; Front answers for these and tunnels any other.
GOOGLE_HOSTS = ("www.googleapis.com", "storage.googleapis.com")


def make_certificates(directory: Path) -> tuple[Path, Path, Path]:
    """(CA certificate, server certificate, server key) for GOOGLE_HOSTS, valid for a day."""
    return tls.issue(directory, "local-gcs test CA", [*GOOGLE_HOSTS, "*.storage.googleapis.com"])


def ca_variables(bundle: str) -> dict[str, str]:
    """What makes a process trust `bundle`: TensorFlow's GCS client (curl), Python's ssl, requests."""
    return {"CURL_CA_BUNDLE": bundle, "SSL_CERT_FILE": bundle, "REQUESTS_CA_BUNDLE": bundle}


def system_ca_bundle() -> Path | None:
    """The CA bundle this machine's Python trusts, if it has one file of them."""
    paths = ssl.get_default_verify_paths()
    for candidate in (paths.cafile, paths.openssl_cafile, "/etc/ssl/certs/ca-certificates.crt"):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    try:
        import certifi

        return Path(certifi.where())
    except ImportError:
        return None
