"""The local CA, a server certificate for Google's Cloud Storage hosts signed by it, and what makes
a client trust it."""

from __future__ import annotations

import datetime
import os
import ssl
from pathlib import Path

# The hosts TensorFlow's GCS client calls; Front answers for these and tunnels any other.
GOOGLE_HOSTS = ("www.googleapis.com", "storage.googleapis.com")


def make_certificates(directory: Path) -> tuple[Path, Path, Path]:
    """(CA certificate, server certificate, server key) for GOOGLE_HOSTS, valid for a day."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    valid = dict(not_valid_before=now - datetime.timedelta(hours=1), not_valid_after=now + datetime.timedelta(days=1))
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "local-gcs test CA")])
    ca = (x509.CertificateBuilder(subject_name=ca_name, issuer_name=ca_name, public_key=ca_key.public_key(),
                                  serial_number=x509.random_serial_number(), **valid)
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    names = [x509.DNSName(host) for host in GOOGLE_HOSTS] + [x509.DNSName("*.storage.googleapis.com")]
    server = (x509.CertificateBuilder(subject_name=x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, GOOGLE_HOSTS[0])]),
                                      issuer_name=ca_name, public_key=key.public_key(),
                                      serial_number=x509.random_serial_number(), **valid)
              .add_extension(x509.SubjectAlternativeName(names), critical=False)
              .sign(ca_key, hashes.SHA256()))
    paths = directory / "ca.pem", directory / "server.pem", directory / "server.key"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(server.public_bytes(serialization.Encoding.PEM))
    # The key is readable by its owner only, from its first byte.
    paths[2].unlink(missing_ok=True)
    with os.fdopen(os.open(paths[2], os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as key_file:
        key_file.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                         serialization.NoEncryption()))
    return paths


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
