"""Mutual TLS for an agent's built-in server: what an L1 (core) agent serves with.

    agent = reach.Agent(
        "payments", addr="https://10.0.0.5:7001", hub="https://hub:8800",
        tls=reach.TLSConfig(cert="payments.pem", key="payments.key", ca="ca.pem"),
    )

``reach certs issue AGENT_ID`` on the hub host writes ``cert`` and ``key``; ``ca`` is the
hub CA's ``ca.pem`` (``reach certs init``). The server speaks TLS 1.2 or later, requires
a client certificate signed by ``ca`` and, once the handshake is done, one that carries
the hub's identity (SAN ``urn:agent-reach:hub``): any other peer is disconnected before
a byte of its request is read, so no handler runs for it. A client that speaks plain
HTTP to the port gets one ``400`` status line (the hub's TCP probes read it as "alive")
and nothing else.

Serving the ASGI app (``agent.asgi_app()``) with uvicorn instead, the same rule is:

    uvicorn module:app --host 0.0.0.0 --port 7001 \\
        --ssl-certfile payments.pem --ssl-keyfile payments.key \\
        --ssl-ca-certs ca.pem --ssl-cert-reqs 2

(``2`` is ``ssl.CERT_REQUIRED``; uvicorn checks the chain but not the hub's SAN, and its
TLS port answers plain-HTTP probes with nothing, so the hub's probes see it as down.)
"""

from __future__ import annotations

import logging
import os
import socket
import ssl
from dataclasses import dataclass
from http.server import ThreadingHTTPServer
from typing import Any

from reach.core.security.trust import HUB_URI
from reach.errors import InvalidRegistration

log = logging.getLogger("reach.sdk.tls")

HANDSHAKE_TIMEOUT_S = 10.0
_TLS_RECORD = 0x16  # the first byte of every TLS handshake record (a ClientHello)
_REFUSAL_BODY = b'{"code": 400, "message": "this agent serves https with client certificates"}'
_PLAIN_REFUSAL = (
    b"HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nConnection: close\r\n"
    b"Content-Length: %d\r\n\r\n%s" % (len(_REFUSAL_BODY), _REFUSAL_BODY)
)


@dataclass(frozen=True, slots=True)
class TLSConfig:
    """The agent's certificate and key, and the CA whose clients it serves.

    ``require_client_cert=False`` serves plain server-side TLS (an L2 agent over https):
    no client certificate is asked for, and none is checked.
    """

    cert: str | os.PathLike[str]
    key: str | os.PathLike[str]
    ca: str | os.PathLike[str]
    require_client_cert: bool = True

    def server_context(self) -> ssl.SSLContext:
        """An SSLContext for the agent's server; InvalidRegistration if a file is unusable."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            ctx.load_cert_chain(os.fspath(self.cert), os.fspath(self.key))
            if self.require_client_cert:
                ctx.load_verify_locations(cafile=os.fspath(self.ca))
        except (OSError, ssl.SSLError) as exc:
            raise InvalidRegistration(
                f"tls: cannot load cert {os.fspath(self.cert)!r}, key {os.fspath(self.key)!r} "
                f"or ca {os.fspath(self.ca)!r}: {exc}",
                field="tls",
            ) from None
        if self.require_client_cert:
            ctx.verify_mode = ssl.CERT_REQUIRED
        return ctx


def hub_peer_refusal(peer: dict[str, Any] | None) -> str | None:
    """Why a verified client certificate is not the hub's, or None if it is.

    The CA vouches for the chain; the SAN URI says the peer is the hub and not, say, an
    agent presenting its own certificate (those carry ``urn:agent-reach:agent:<id>``).
    """
    if not peer:
        return "no client certificate"
    uris = [value for kind, value in peer.get("subjectAltName", ()) if kind == "URI"]
    if HUB_URI not in uris:
        return f"client certificate names {uris or 'no URI'}, not {HUB_URI}"
    return None


LISTEN_BACKLOG = 1024
"""Connections an agent's server lets wait to be accepted. A hub keeps hundreds of
exchanges in flight and sends a burst at once; the standard library's 5 made the kernel
drop SYNs, and the hub's connects then failed after their timeout (a breaker opened on a
healthy agent)."""


class TLSHTTPServer(ThreadingHTTPServer):
    """A ThreadingHTTPServer whose connections are TLS, handshaken on their own thread.

    The accept loop never waits on a peer: a slow or silent client holds only the thread
    its connection got, for at most ``HANDSHAKE_TIMEOUT_S``.
    """

    request_queue_size = LISTEN_BACKLOG

    def __init__(self, address: tuple[str, int], handler: Any, tls: TLSConfig) -> None:
        self.tls = tls
        self.context = tls.server_context()
        super().__init__(address, handler)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        secured = self._secure(request, client_address)
        if secured is None:
            self.shutdown_request(request)
            return
        super().process_request_thread(secured, client_address)

    def _secure(self, raw: socket.socket, peer: Any) -> ssl.SSLSocket | None:
        secured: ssl.SSLSocket | None = None
        try:
            raw.settimeout(HANDSHAKE_TIMEOUT_S)
            first = raw.recv(1, socket.MSG_PEEK)
            if not first:
                return None  # connected and left (a TCP check)
            if first[0] != _TLS_RECORD:
                _refuse_plain(raw)
                log.debug("refused a plain-HTTP connection from %s", peer)
                return None
            secured = self.context.wrap_socket(raw, server_side=True, do_handshake_on_connect=False)
            secured.do_handshake()
        except (OSError, ssl.SSLError) as exc:  # SSLError is an OSError: named for the reader
            log.warning("refused a TLS connection from %s: %s", peer, exc)
            if secured is not None:  # it took the descriptor over from raw
                _close(secured)
            return None
        if self.tls.require_client_cert:
            refused = hub_peer_refusal(secured.getpeercert())
            if refused is not None:
                log.warning("refused a TLS connection from %s: %s", peer, refused)
                _close(secured)
                return None
        secured.settimeout(None)  # as the plain server's sockets: handlers set their own
        return secured


def _refuse_plain(raw: socket.socket) -> None:
    """Answer a plain-HTTP request with one status line, having read what it sent (closing
    with unread data would reset the connection before the peer reads the answer)."""
    raw.settimeout(1.0)
    try:
        raw.recv(65_536)
        raw.sendall(_PLAIN_REFUSAL)
        raw.shutdown(socket.SHUT_WR)
    except OSError:
        pass


def _close(sock: ssl.SSLSocket) -> None:
    try:
        sock.close()
    except OSError:
        pass
