"""The DTLS certificate WHIP pushes give FFmpeg's muxer: P-256 (FFmpeg's own P-224 one is refused by OpenSSL 4
receivers), its key private to the server's user, made once per process."""

import stat
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from app.media.whip_certificate import whip_certificate_options, write_certificate


def test_the_certificate_is_p256_and_matches_its_private_key(tmp_path: Path) -> None:
    files = write_certificate(tmp_path)
    certificate = x509.load_pem_x509_certificate(Path(files["cert_file"]).read_bytes())
    key = serialization.load_pem_private_key(Path(files["key_file"]).read_bytes(), password=None)
    public = certificate.public_key()
    assert isinstance(public, ec.EllipticCurvePublicKey) and isinstance(public.curve, ec.SECP256R1)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    assert key.public_key().public_numbers() == public.public_numbers()
    assert stat.S_IMODE(Path(files["key_file"]).stat().st_mode) == 0o600


def test_one_certificate_per_process() -> None:
    first, second = whip_certificate_options(), whip_certificate_options()
    assert first == second and Path(first["cert_file"]).is_file()
