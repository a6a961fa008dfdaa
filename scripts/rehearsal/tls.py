"""A throwaway certificate authority for the rehearsals' local stand-ins of Google's services (Cloud
Storage's hosts, Artifact Registry's): a CA and one server certificate it signs, valid for a day,
written where the stand-in and its clients read them. The server key is its owner's alone from its
first byte."""

from __future__ import annotations

import datetime
import ipaddress
import os
from pathlib import Path
from typing import Sequence

VALID_FOR = datetime.timedelta(days=1)


def issue(directory: Path, authority: str, hosts: Sequence[str], addresses: Sequence[str] = (),
          names: tuple[str, str, str] = ("ca.pem", "server.pem", "server.key")) -> tuple[Path, Path, Path]:
    """(CA certificate, server certificate, server key) in `directory`, under `names`: a CA whose
    common name is `authority`, and a certificate for `hosts` (DNS names, wildcards allowed; the
    first is its common name) and `addresses` (IP addresses)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    # An hour back: a container's clock may lag this machine's a little.
    valid = dict(not_valid_before=now - datetime.timedelta(hours=1), not_valid_after=now + VALID_FOR)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, authority)])
    ca = (x509.CertificateBuilder(subject_name=ca_name, issuer_name=ca_name, public_key=ca_key.public_key(),
                                  serial_number=x509.random_serial_number(), **valid)
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    alternatives = [x509.DNSName(host) for host in hosts] + [x509.IPAddress(ipaddress.ip_address(a)) for a in addresses]
    server = (x509.CertificateBuilder(subject_name=x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]),
                                      issuer_name=ca_name, public_key=key.public_key(),
                                      serial_number=x509.random_serial_number(), **valid)
              .add_extension(x509.SubjectAlternativeName(alternatives), critical=False)
              .sign(ca_key, hashes.SHA256()))
    paths = tuple(directory / name for name in names)
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(server.public_bytes(serialization.Encoding.PEM))
    paths[2].unlink(missing_ok=True)
    with os.fdopen(os.open(paths[2], os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as key_file:
        key_file.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                         serialization.NoEncryption()))
    return paths
