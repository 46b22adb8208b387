"""A throwaway CA and a certificate for 127.0.0.1 and localhost (trustme), for the HTTPS tests."""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass
from pathlib import Path

import trustme
from cryptography import x509
from cryptography.hazmat.primitives import serialization


@dataclass(frozen=True)
class TlsFiles:
    cert: Path
    key: Path
    ca: Path
    spki_sha256: str  # base64 SHA-256 of the certificate's public key, for Chromium's SPKI allowlist


def make_tls(directory: Path) -> TlsFiles:
    ca = trustme.CA()
    issued = ca.issue_cert("127.0.0.1", "localhost")
    cert, key, ca_file = directory / "server.pem", directory / "server.key", directory / "ca.pem"
    issued.cert_chain_pems[0].write_to_path(str(cert))
    for extra in issued.cert_chain_pems[1:]:
        extra.write_to_path(str(cert), append=True)
    issued.private_key_pem.write_to_path(str(key))
    ca.cert_pem.write_to_path(str(ca_file))
    leaf = x509.load_pem_x509_certificate(issued.cert_chain_pems[0].bytes())
    spki = leaf.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return TlsFiles(cert, key, ca_file, base64.b64encode(hashlib.sha256(spki).digest()).decode())
