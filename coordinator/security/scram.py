"""SCRAM-SHA-256 / SCRAM-SHA-512 (RFC 5802, RFC 7677) as Kafka's ``ScramSaslServer`` and
``ScramFormatter`` do them (docs/security.md, "SCRAM").

Credentials are kept as Kafka keeps them: salt, StoredKey, ServerKey and the iteration count --
never the password, never the salted password.  Written with ``hashlib``/``hmac`` from the
standard library: the server side is two messages, and Kafka's rules (its messages, the
``tokenauth`` extension, the authorization id check) sit in between its steps.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets
from collections.abc import Callable
from typing import Final

from msgspec import Struct

# mechanism -> (hashlib name, Kafka's ScramMechanism type id in the admin APIs)
MECHANISMS: Final[dict[str, tuple[str, int]]] = {"SCRAM-SHA-256": ("sha256", 1), "SCRAM-SHA-512": ("sha512", 2)}
BY_TYPE: Final[dict[int, str]] = {t: m for m, (_h, t) in MECHANISMS.items()}
MIN_ITERATIONS: Final = 4096  # ScramMechanism.minIterations
MAX_ITERATIONS: Final = 16384  # AlterUserScramCredentials' upper bound (ControllerApis/ScramControlManager)


class ScramCredential(Struct, frozen=True):
    """One user's SCRAM credential for one mechanism: salt, StoredKey, ServerKey and iterations."""

    salt: bytes
    stored_key: bytes
    server_key: bytes
    iterations: int

    def to_json(self) -> dict[str, object]:
        b64 = base64.b64encode
        return {
            "salt": b64(self.salt).decode(),
            "stored_key": b64(self.stored_key).decode(),
            "server_key": b64(self.server_key).decode(),
            "iterations": self.iterations,
        }

    @classmethod
    def from_json(cls, d: dict[str, object]) -> ScramCredential:
        b = base64.b64decode
        return cls(b(str(d["salt"])), b(str(d["stored_key"])), b(str(d["server_key"])), int(str(d["iterations"])))


def _h(mechanism: str) -> str:
    return MECHANISMS[mechanism][0]


def salted_password(mechanism: str, password: str, salt: bytes, iterations: int) -> bytes:
    return hashlib.pbkdf2_hmac(_h(mechanism), password.encode(), salt, iterations)


def credential_from_salted(mechanism: str, salted: bytes, salt: bytes, iterations: int) -> ScramCredential:
    """ScramFormatter.generateCredential: StoredKey = H(HMAC(salted, "Client Key")),
    ServerKey = HMAC(salted, "Server Key")."""
    h = _h(mechanism)
    client_key = hmac.digest(salted, b"Client Key", h)
    stored_key = hashlib.new(h, client_key).digest()
    server_key = hmac.digest(salted, b"Server Key", h)
    return ScramCredential(salt, stored_key, server_key, iterations)


def make_credential(mechanism: str, password: str, iterations: int, salt: bytes | None = None) -> ScramCredential:
    salt = salt if salt is not None else secrets.token_bytes(16)
    return credential_from_salted(mechanism, salted_password(mechanism, password, salt, iterations), salt, iterations)


class ScramError(Exception):
    """Authentication failed.  ``public`` messages are sent to the client as they are (Kafka's
    SaslAuthenticationException); the others become Kafka's generic "invalid credentials" text
    so that the answer never tells whether the user exists."""

    def __init__(self, message: str, public: bool = False) -> None:
        super().__init__(message)
        self.public = public


# ScramMessages.ClientFirstMessage: gs2 header "n," [a=authzid] "," then n=user,r=nonce[,ext...]
_SASLNAME = r"(?:[\x01-\x2b\x2d-\x3c\x3e-\x7f]|=2C|=3D)+"
_CLIENT_FIRST = re.compile(
    rf"n,(?:a=(?P<authzid>{_SASLNAME}))?,(?P<bare>n=(?P<user>{_SASLNAME}),r=(?P<nonce>[\x21-\x2b\x2d-\x7e]+)"
    r"(?P<ext>(?:,[A-Za-z]+=[\x01-\x2b\x2d-\x7f]*)*))$",
    re.DOTALL,
)
_CLIENT_FINAL = re.compile(
    r"(?P<wp>c=(?P<channel>[A-Za-z0-9+/=]*),r=(?P<nonce>[\x21-\x2b\x2d-\x7e]+)"
    r"(?:,[A-Za-z]+=[\x01-\x2b\x2d-\x7f]*)*),p=(?P<proof>[A-Za-z0-9+/=]+)$",
    re.DOTALL,
)


def _unescape(name: str) -> str:
    return name.replace("=2C", ",").replace("=3D", "=")


class ScramServer:
    """One SCRAM exchange: ``evaluate(client-first)`` → server-first, ``evaluate(client-final)`` →
    server-final; :class:`ScramError` on failure.  ``lookup(user)`` gives the user's credential
    for this mechanism, or None."""

    def __init__(self, mechanism: str, lookup: Callable[[str], ScramCredential | None]) -> None:
        self.mechanism = mechanism
        self._lookup = lookup
        self._step = 0
        self.user: str | None = None
        self._cred: ScramCredential | None = None
        self._nonce = ""
        self._auth_prefix = ""
        self.complete = False

    def evaluate(self, token: bytes) -> bytes:
        try:
            text = token.decode("utf-8")
        except UnicodeDecodeError:
            raise ScramError("Invalid SCRAM message encoding") from None
        if self._step == 0:
            return self._first(text)
        if self._step == 1:
            return self._final(text)
        raise ScramError("Unexpected challenge in Sasl server state COMPLETE")

    def _first(self, text: str) -> bytes:
        m = _CLIENT_FIRST.match(text)
        if m is None:
            raise ScramError("Invalid SCRAM client first message")
        user = _unescape(m["user"])
        ext = dict(e.split("=", 1) for e in m["ext"].split(",") if e)
        if ext.get("tokenauth", "").lower() == "true":
            raise ScramError(f"Token Authentication failed: Invalid tokenId : {user}")  # no delegation tokens here
        cred = self._lookup(user)
        if cred is None:
            raise ScramError("Authentication failed: Invalid user credentials")
        authzid = m["authzid"]
        if authzid is not None and _unescape(authzid) != user:
            raise ScramError(
                "Authentication failed: Client requested an authorization id that is different from username",
                public=True,
            )
        self.user, self._cred = user, cred
        self._nonce = m["nonce"] + secrets.token_urlsafe(24)
        server_first = f"r={self._nonce},s={base64.b64encode(cred.salt).decode()},i={cred.iterations}"
        self._auth_prefix = m["bare"] + "," + server_first
        self._step = 1
        return server_first.encode()

    def _final(self, text: str) -> bytes:
        m = _CLIENT_FINAL.match(text)
        if m is None:
            raise ScramError("Authentication failed: Invalid client final message")
        # Kafka checks endsWith, not equality: librdkafka 2.0 and older send the client nonce
        # in front of the server's combined one
        if not m["nonce"].endswith(self._nonce):
            raise ScramError("Invalid client nonce in the final client message.")
        cred = self._cred
        assert cred is not None
        h = _h(self.mechanism)
        auth_message = (self._auth_prefix + "," + m["wp"]).encode()
        try:
            proof = base64.b64decode(m["proof"], validate=True)
        except ValueError:
            raise ScramError("Invalid client credentials") from None
        signature = hmac.digest(cred.stored_key, auth_message, h)
        if len(proof) != len(signature):
            raise ScramError("Invalid client credentials")
        client_key = bytes(a ^ b for a, b in zip(proof, signature, strict=True))
        if not hmac.compare_digest(hashlib.new(h, client_key).digest(), cred.stored_key):
            raise ScramError("Invalid client credentials")
        self._step = 2
        self.complete = True
        server_signature = hmac.digest(cred.server_key, auth_message, h)
        return b"v=" + base64.b64encode(server_signature)
