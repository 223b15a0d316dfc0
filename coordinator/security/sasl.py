"""The SASL authenticator of one connection: Kafka's ``SaslServerAuthenticator`` as a sans-IO
state machine (docs/security.md, "SASL").

The server feeds it each frame read before authentication completes (and, on an authenticated
connection, from a SaslHandshake on: KIP-368 re-authentication) with ``now_ms``; it answers a
:class:`Step`: the bytes to send, whether to close, whether authentication is complete.

* before the handshake only ApiVersions (handled by the server's normal path: ``delegate``) and
  SaslHandshake are accepted; anything else closes the connection;
* SaslHandshake v0: the tokens that follow are raw (a 4-byte size, no request header), as Kafka
  does for old clients; v1: they come in SaslAuthenticate requests;
* a mechanism not enabled → UNSUPPORTED_SASL_MECHANISM with the enabled list, then close;
* failed credentials → SASL_AUTHENTICATION_FAILED (58) with Kafka's message (one message for
  unknown users and wrong passwords), then close;
* ``connections.max.reauth.ms`` > 0: the session lifetime is sent in the final SaslAuthenticate
  answer; re-authentication must keep mechanism and principal; after expiry the server closes
  the connection at the next request that is not a SaslHandshake.
"""

from __future__ import annotations

from enum import Enum
from typing import Any, Final

from msgspec import Struct
from rallypoint.protocol import codec
from rallypoint.protocol.errors import ErrorCode
from rallypoint.protocol.framing import FrameError, parse_request_header, peek_api_key_version

from .credentials import CredentialStore
from .scram import ScramError, ScramServer

SUPPORTED: Final = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
SASL_HANDSHAKE: Final = 17
SASL_AUTHENTICATE: Final = 36
API_VERSIONS: Final = 18

# ApiKeys names as Kafka prints them in "Unexpected Kafka request of type ..." (a few; else the key)
_API_NAMES: Final = {0: "PRODUCE", 1: "FETCH", 3: "METADATA", 10: "FIND_COORDINATOR", 11: "JOIN_GROUP"}


def parse_mechanisms(value: str) -> list[str]:
    names = [v.strip().upper() for v in value.split(",") if v.strip()]
    if not names:
        raise ValueError("sasl.enabled.mechanisms names no mechanism")
    bad = [n for n in names if n not in SUPPORTED]
    if bad:
        raise ValueError(f"sasl.enabled.mechanisms: {', '.join(bad)} not supported (supported: {', '.join(SUPPORTED)})")
    return list(dict.fromkeys(names))


class State(Enum):
    INITIAL = "initial"  # ApiVersions or SaslHandshake expected
    AUTHENTICATE = "authenticate"  # tokens expected
    REAUTH_BAD_MECHANISM = "reauth_bad_mechanism"
    COMPLETE = "complete"
    FAILED = "failed"


class Step(Struct):
    """What to do after a frame: the answer to send, whether to close or delegate, whether authentication is done."""

    answer: bytes = b""  # whole frame (size prefix included) to send, b"" = nothing
    close: bool = False
    complete: bool = False
    delegate: bool = False  # an ApiVersions request: the server answers it the usual way
    reason: str = ""


def _frame(payload: bytes) -> bytes:
    return len(payload).to_bytes(4, "big") + payload


class PlainServer:
    """Kafka's ``PlainSaslServer``: ``authzid NUL user NUL password``."""

    def __init__(self, store: CredentialStore) -> None:
        self._store = store
        self.user: str | None = None
        self.complete = False

    def evaluate(self, token: bytes) -> bytes:
        text = token.decode("utf-8", errors="replace")
        tokens = text.split("\0")
        if len(tokens) != 3:
            raise ScramError(f"Invalid SASL/PLAIN response: expected 3 tokens, got {len(tokens)}", public=True)
        authzid, user, password = tokens
        if not user:
            raise ScramError("Authentication failed: username not specified", public=True)
        if not password:
            raise ScramError("Authentication failed: password not specified", public=True)
        if not self._store.check_plain(user, password):
            raise ScramError("Authentication failed: Invalid username or password", public=True)
        if authzid and authzid != user:
            raise ScramError(
                "Authentication failed: Client requested an authorization id that is different from username",
                public=True,
            )
        self.user = user
        self.complete = True
        return b""


class SaslAuthenticator:
    def __init__(
        self,
        mechanisms: list[str],
        store: CredentialStore,
        reauth_ms: int,
        max_elements: int | None = None,
    ) -> None:
        self.mechanisms = mechanisms
        self.store = store
        self.reauth_ms = reauth_ms
        self.max_elements = max_elements
        self.state = State.INITIAL
        self.mechanism: str | None = None
        self.principal: str | None = None
        self.session_expiry_ms: int | None = None
        self._raw = False  # after a v0 handshake
        self._server: PlainServer | ScramServer | None = None
        self._previous: tuple[str, str] | None = None  # (mechanism, principal) when re-authenticating
        self._bad_mechanism_message = ""

    @property
    def reauthenticating(self) -> bool:
        return self._previous is not None

    def _what(self) -> str:
        return "re-authentication" if self.reauthenticating else "authentication"

    def expired(self, now_ms: int) -> bool:
        return self.session_expiry_ms is not None and now_ms >= self.session_expiry_ms

    def begin_reauthentication(self) -> None:
        """A SaslHandshake on an authenticated connection (KIP-368)."""
        assert self.mechanism is not None and self.principal is not None
        self._previous = (self.mechanism, self.principal)
        self.state = State.INITIAL
        self._server = None
        self._raw = False

    # ------------------------------------------------------------------ frames

    def on_frame(self, body: bytes | memoryview, now_ms: int) -> Step:
        if self.state in (State.COMPLETE, State.FAILED):
            return self._fail_close("no frame expected")
        if self.state == State.REAUTH_BAD_MECHANISM:
            return self._fail_close(self._bad_mechanism_message)
        if self._raw:
            return self._raw_token(bytes(body), now_ms)
        try:
            api_key, version, corr = peek_api_key_version(body)
        except FrameError:
            return self._fail_close("frame shorter than a request header")
        if self.state == State.INITIAL:
            if api_key == API_VERSIONS and not self.reauthenticating:
                return Step(delegate=True)
            if api_key != SASL_HANDSHAKE:
                return self._fail_close(
                    f"Unexpected Kafka request of type {_API_NAMES.get(api_key, api_key)} during SASL handshake."
                )
            request = self._decode(api_key, version, body)
            if request is None:
                return self._fail_close("undecodable SaslHandshake")
            return self._handshake(version, corr, str(request.mechanism))
        # State.AUTHENTICATE with SaslAuthenticate headers
        if api_key != SASL_AUTHENTICATE:
            return self._fail_close(
                f"Unexpected Kafka request of type {_API_NAMES.get(api_key, api_key)} during SASL authentication."
            )
        request = self._decode(api_key, version, body)
        if request is None:
            return self._fail_close("undecodable SaslAuthenticate")
        return self._authenticate(version, corr, bytes(request.auth_bytes), now_ms)

    def _decode(self, api_key: int, version: int, body: bytes | memoryview) -> Any:
        lo, hi = (0, 1) if api_key == SASL_HANDSHAKE else (0, 2)
        if not lo <= version <= hi:
            return None
        try:
            header = parse_request_header(body, codec.request_header_version(api_key, version))
            return codec.decode_request(api_key, version, body, header.size, self.max_elements)
        except (FrameError, codec.DecodeError):
            return None

    def _fail_close(self, reason: str, answer: bytes = b"") -> Step:
        self.state = State.FAILED
        return Step(answer=answer, close=True, reason=reason)

    def _handshake(self, version: int, corr: int, mechanism: str) -> Step:
        if mechanism not in self.mechanisms:
            answer = codec.encode_response(
                SASL_HANDSHAKE,
                version,
                corr,
                {"error_code": ErrorCode.UNSUPPORTED_SASL_MECHANISM, "mechanisms": list(self.mechanisms)},
            )
            return self._fail_close(f"Unsupported SASL mechanism {mechanism}", answer)
        answer = codec.encode_response(
            SASL_HANDSHAKE, version, corr, {"error_code": ErrorCode.NONE, "mechanisms": list(self.mechanisms)}
        )
        self._raw = version == 0
        if self._previous is not None and self._previous[0] != mechanism:
            self._bad_mechanism_message = (
                f"SASL mechanism '{mechanism}' requested by client is not supported for re-authentication "
                f"of mechanism '{self._previous[0]}'"
            )
            self.state = State.REAUTH_BAD_MECHANISM
            return Step(answer=answer)
        self.mechanism = mechanism
        if mechanism == "PLAIN":
            self._server = PlainServer(self.store)
        else:
            self._server = ScramServer(mechanism, lambda user: self.store.scram(mechanism, user))
        self.state = State.AUTHENTICATE
        return Step(answer=answer)

    def _evaluate(self, token: bytes, now_ms: int) -> tuple[bytes, int]:
        """The server's token and the session lifetime (0 until complete); ScramError on failure."""
        server = self._server
        assert server is not None
        out = server.evaluate(token)
        if not server.complete:
            return out, 0
        principal = server.user
        assert principal is not None
        if self._previous is not None and self._previous[1] != principal:
            raise ScramError(
                f"Cannot change principals during re-authentication from User:{self._previous[1]}: User:{principal}",
                public=True,
            )
        lifetime = self.reauth_ms if self.reauth_ms > 0 else 0
        self.session_expiry_ms = now_ms + lifetime if lifetime else None
        self.principal = principal
        self.state = State.COMPLETE
        self._previous = None
        return out, lifetime

    def _failure_message(self, e: ScramError) -> str:
        if e.public:
            return str(e)
        # SaslServerAuthenticator: never the SaslException's own text (it may tell the user exists)
        return (
            f"Authentication failed during {self._what()} due to invalid credentials "
            f"with SASL mechanism {self.mechanism}"
        )

    def _authenticate(self, version: int, corr: int, token: bytes, now_ms: int) -> Step:
        try:
            out, lifetime = self._evaluate(token, now_ms)
        except ScramError as e:
            message = self._failure_message(e)
            body: dict[str, Any] = {
                "error_code": ErrorCode.SASL_AUTHENTICATION_FAILED,
                "error_message": message,
                "auth_bytes": b"",
            }
            answer = codec.encode_response(SASL_AUTHENTICATE, version, corr, body)
            return self._fail_close(message, answer)
        body = {"error_code": ErrorCode.NONE, "error_message": None, "auth_bytes": out}
        if version >= 1:
            body["session_lifetime"] = lifetime
        answer = codec.encode_response(SASL_AUTHENTICATE, version, corr, body)
        return Step(answer=answer, complete=self.state == State.COMPLETE)

    def _raw_token(self, token: bytes, now_ms: int) -> Step:
        """After SaslHandshake v0: size-prefixed tokens both ways; a failure just closes."""
        try:
            out, _lifetime = self._evaluate(token, now_ms)
        except ScramError as e:
            return self._fail_close(self._failure_message(e))
        complete = self.state == State.COMPLETE
        if complete:
            self._raw = False
        # Kafka sends every token the SaslServer returns, an empty one (PLAIN's) included
        return Step(answer=_frame(out), complete=complete)
