"""The ``ssl`` context of SSL and SASL_SSL listeners from Kafka's PEM settings (KIP-651;
docs/security.md, "TLS").

* ``ssl.keystore.location``: one PEM file holding the (PKCS#8) private key and the certificate
  chain; or inline ``ssl.keystore.key`` + ``ssl.keystore.certificate.chain``; ``ssl.key.password``
  for an encrypted key;
* ``ssl.truststore.location`` / ``ssl.truststore.certificates``: the CAs client certificates
  are checked with (``ssl.client.auth`` = requested / required: mutual TLS).
"""

from __future__ import annotations

import os
import ssl
import tempfile
from typing import Any


def _load_inline_chain(ctx: ssl.SSLContext, key: str, chain: str, password: str | None) -> None:
    # ssl loads a key and chain only from files: a private temporary file, removed at once
    fd, path = tempfile.mkstemp(prefix="rallypoint-keystore-", suffix=".pem")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(key.strip() + "\n" + chain.strip() + "\n")
        ctx.load_cert_chain(path, password=password)
    finally:
        os.unlink(path)


def server_context(cfg: Any) -> ssl.SSLContext:
    """ValueError naming the setting when the material cannot be loaded."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2  # Kafka's ssl.enabled.protocols: TLSv1.2,TLSv1.3
    password = cfg["ssl.key.password"]
    try:
        if cfg["ssl.keystore.location"]:
            ctx.load_cert_chain(cfg["ssl.keystore.location"], password=password)
        else:
            _load_inline_chain(ctx, cfg["ssl.keystore.key"], cfg["ssl.keystore.certificate.chain"], password)
    except (OSError, ValueError) as e:
        where = cfg["ssl.keystore.location"] or "ssl.keystore.key/ssl.keystore.certificate.chain"
        raise ValueError(f"cannot load the PEM keystore ({where}): {e}") from None
    try:
        if cfg["ssl.truststore.location"]:
            ctx.load_verify_locations(cafile=cfg["ssl.truststore.location"])
        if cfg["ssl.truststore.certificates"]:
            ctx.load_verify_locations(cadata=cfg["ssl.truststore.certificates"])
    except (OSError, ValueError) as e:
        where = cfg["ssl.truststore.location"] or "ssl.truststore.certificates"
        raise ValueError(f"cannot load the PEM truststore ({where}): {e}") from None
    mode = cfg["ssl.client.auth"]
    if mode != "none" and not (cfg["ssl.truststore.location"] or cfg["ssl.truststore.certificates"]):
        raise ValueError(f"ssl.client.auth={mode} needs ssl.truststore.location or ssl.truststore.certificates")
    ctx.verify_mode = {"required": ssl.CERT_REQUIRED, "requested": ssl.CERT_OPTIONAL}.get(mode, ssl.CERT_NONE)
    return ctx
