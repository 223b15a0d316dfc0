"""``rallypoint certs --out DIR [--host NAME ...]``: a throwaway CA and broker certificate for
tests and the docker image (docs/security.md, "Certificates for tests").

Writes, in PEM:

* ``ca.pem``: the CA certificate (what clients trust: ``ssl.ca.location``, ``ssl_cafile``);
* ``broker.pem``: the broker's PKCS#8 private key followed by its certificate chain (broker
  certificate, then the CA), for ``ssl.keystore.type=PEM`` + ``ssl.keystore.location``; the
  certificate names ``localhost``, ``127.0.0.1`` and every ``--host``;
* ``client.pem``: a client key and certificate signed by the same CA, for mutual TLS
  (``ssl.client.auth=required`` with ``ssl.truststore.location=ca.pem``).

Keys are ECDSA P-256; certificates are valid from a day ago for ``--days`` days.  Throwaway
material: the CA key is not written anywhere.
"""

from __future__ import annotations

import argparse
import datetime
import ipaddress
import os
from collections.abc import Sequence
from pathlib import Path


def _names(hosts: Sequence[str]) -> list[object]:
    from cryptography import x509

    out: list[object] = []
    seen: set[str] = set()
    for h in ["localhost", "127.0.0.1", *hosts]:
        if h in seen:
            continue
        seen.add(h)
        try:
            out.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            out.append(x509.DNSName(h))
    return out


def generate(out: Path, hosts: Sequence[str] = (), days: int = 365) -> dict[str, Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)
    start, end = now - datetime.timedelta(days=1), now + datetime.timedelta(days=days)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "rallypoint throwaway CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    def leaf(common_name: str, usage: object, sans: list[object] | None) -> tuple[bytes, bytes]:
        key = ec.generate_private_key(ec.SECP256R1())
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
            .issuer_name(ca_name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start)
            .not_valid_after(end)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)  # type: ignore[list-item]
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        )
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)  # type: ignore[arg-type]
        cert = builder.sign(ca_key, hashes.SHA256())
        key_pem = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        return key_pem, cert.public_bytes(serialization.Encoding.PEM)

    ca_pem = ca.public_bytes(serialization.Encoding.PEM)
    broker_key, broker_cert = leaf("localhost", ExtendedKeyUsageOID.SERVER_AUTH, _names(hosts))
    client_key, client_cert = leaf("rallypoint-client", ExtendedKeyUsageOID.CLIENT_AUTH, None)
    out.mkdir(parents=True, exist_ok=True)
    files = {
        "ca.pem": (ca_pem, 0o644),
        "broker.pem": (broker_key + broker_cert + ca_pem, 0o600),
        "client.pem": (client_key + client_cert, 0o600),
    }
    written: dict[str, Path] = {}
    for name, (data, mode) in files.items():
        path = out / name
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(path, mode)
        written[name] = path
    return written


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="rallypoint certs", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="directory to write ca.pem, broker.pem and client.pem into")
    p.add_argument(
        "--host",
        action="append",
        default=[],
        help="another name or address the broker certificate is valid for (repeatable)",
    )
    p.add_argument("--days", type=int, default=365, help="validity in days (default 365)")
    args = p.parse_args(argv)
    try:
        written = generate(Path(args.out), args.host, args.days)
    except ImportError:
        print("rallypoint certs: error: needs the 'cryptography' package", flush=True)
        return 1
    for name, path in written.items():
        print(f"wrote {path}" + ("  (key + certificate chain)" if name == "broker.pem" else ""))
    return 0
