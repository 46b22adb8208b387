"""The DTLS certificate FFmpeg's `whip` muxer is given: a self-signed ECDSA P-256 one.

Left to itself, an FFmpeg built with GnuTLS (as PyAV's wheel is) makes a P-224 certificate. A WHIP receiver on
OpenSSL 4, aiortc's as in this server, refuses it: OpenSSL 4 has no P-224 in TLS, so the client's hello lists no
such group and the certificate's key fails its curve check (alert 47, illegal_parameter; FFmpeg says "DTLS
session failed"). Browsers and libdatachannel use P-256, which every receiver takes."""

from __future__ import annotations

import datetime
import tempfile
import threading
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

VALID_DAYS = 30
_lock = threading.Lock()
_files: dict[str, str] | None = None


def write_certificate(directory: Path) -> dict[str, str]:
    """A new key and certificate written to `directory` (the key readable by its owner only), as the muxer's
    `cert_file` and `key_file` options."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "swapcast")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = directory / "whip-cert.pem", directory / "whip-key.pem"
    key_file.touch(mode=0o600)
    key_file.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    cert_file.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    return {"cert_file": str(cert_file), "key_file": str(key_file)}


def whip_certificate_options() -> dict[str, str]:
    """This process's certificate for the muxer, made on first use in a private temporary directory."""
    global _files
    with _lock:
        if _files is None:
            _files = write_certificate(Path(tempfile.mkdtemp(prefix="swapcast-whip-")))
        return dict(_files)
