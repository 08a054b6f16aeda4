"""The hub's certificate authority for L1 (mutual TLS) agents.

``init_ca`` makes, in one directory (``<storage.home>/certs`` by default):

===========  ==============================================================
ca.pem/key   the hub CA: signs agent certificates and the hub's own
hub.pem/key  the hub's client certificate (SAN ``urn:agent-reach:hub``,
             EKU clientAuth), presented on every delivery to an L1 agent
===========  ==============================================================

``issue_agent_cert`` signs a server certificate for one agent ID (EKU serverAuth) whose
SANs are the hosts it is reached at, ``urn:agent-reach:agent:<id>`` and the identity
name ``reach.core.security.trust.identity_name`` gives (the hub asserts that name, so a
certificate of another agent fails the handshake). Private keys are written with mode
0600; nothing here prints or logs key material. Keys are ECDSA P-256: every TLS stack
the SDK or uvicorn might run on speaks it.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from reach.core.security.trust import HUB_URI, agent_uri, identity_name

CA_CERT = "ca.pem"
CA_KEY = "ca.key"
HUB_CERT = "hub.pem"
HUB_KEY = "hub.key"
AGENTS_DIR = "agents"

CA_DAYS = 3650
HUB_DAYS = 825
AGENT_DAYS = 365
DEFAULT_HOSTS = ("127.0.0.1", "localhost")

# as reach.wire.schemas.AgentId: also a safe file name
_AGENT_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")


@dataclass(frozen=True, slots=True)
class HubCerts:
    """Where ``init_ca`` put the CA and the hub's client certificate."""

    ca_cert: Path
    ca_key: Path
    hub_cert: Path
    hub_key: Path


@dataclass(frozen=True, slots=True)
class AgentCert:
    """One issued agent certificate: what ``reach.TLSConfig`` takes, and what it names."""

    agent_id: str
    cert: Path
    key: Path
    ca_cert: Path
    identity_name: str
    hosts: tuple[str, ...]
    not_after: dt.datetime


def hub_certs(directory: Path) -> HubCerts:
    """The file names ``init_ca`` uses in ``directory`` (whether they exist or not)."""
    return HubCerts(
        directory / CA_CERT, directory / CA_KEY, directory / HUB_CERT, directory / HUB_KEY
    )


def init_ca(
    directory: Path,
    *,
    hub_name: str = "agent-reach",
    force: bool = False,
    now: dt.datetime | None = None,
) -> HubCerts:
    """Create the hub CA and the hub's client certificate in ``directory``.

    An existing CA is never replaced silently: every agent certificate it signed would
    stop verifying. ``force=True`` replaces it (the agents then need new certificates).
    Raises ``FileExistsError`` naming the file otherwise.
    """
    files = hub_certs(directory)
    if not force:
        for path in (files.ca_cert, files.ca_key):
            if path.exists():
                raise FileExistsError(
                    f"{path} exists: a hub CA is already set up there "
                    "(--force replaces it, and every agent certificate must be reissued)"
                )
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    start = _start(now)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Agent-Reach"),
            x509.NameAttribute(NameOID.COMMON_NAME, f"{hub_name} hub CA"),
        ]
    )
    ca_ski = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + dt.timedelta(days=CA_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(cert_sign=True), critical=True)
        .add_extension(ca_ski, critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    hub_key = ec.generate_private_key(ec.SECP256R1())
    hub_cert = _leaf(
        ca_cert,
        ca_key,
        hub_key,
        common_name=f"{hub_name} hub",
        sans=[x509.UniformResourceIdentifier(HUB_URI)],
        usage=ExtendedKeyUsageOID.CLIENT_AUTH,
        start=start,
        days=HUB_DAYS,
    )
    _write_key(files.ca_key, ca_key)
    _write_cert(files.ca_cert, ca_cert)
    _write_key(files.hub_key, hub_key)
    _write_cert(files.hub_cert, hub_cert)
    return files


def issue_agent_cert(
    directory: Path,
    agent_id: str,
    hosts: Sequence[str] = DEFAULT_HOSTS,
    out_dir: Path | None = None,
    days: int = AGENT_DAYS,
    *,
    now: dt.datetime | None = None,
) -> AgentCert:
    """Sign a server certificate for ``agent_id`` with the CA in ``directory``.

    ``hosts`` are the names or IP addresses the hub reaches the agent at (its endpoint's
    host must be one of them); files go to ``out_dir`` (default ``<directory>/agents``)
    as ``<agent_id>.pem`` and ``<agent_id>.key``. Reissuing replaces them.
    Raises ``FileNotFoundError`` if there is no CA, ``ValueError`` for a bad argument.
    """
    if not _AGENT_ID.match(agent_id):
        raise ValueError(f"agent id {agent_id!r} is not a valid agent id")
    if days < 1:
        raise ValueError(f"days must be >= 1, got {days}")
    names = tuple(dict.fromkeys(h.strip() for h in hosts if h.strip()))
    if not names:
        raise ValueError("at least one host is needed (the address the hub reaches it at)")
    files = hub_certs(directory)
    for path in (files.ca_cert, files.ca_key):
        if not path.exists():
            raise FileNotFoundError(f"{path} is missing: run `reach certs init` first")
    ca_cert = x509.load_pem_x509_certificate(files.ca_cert.read_bytes())
    ca_key = serialization.load_pem_private_key(files.ca_key.read_bytes(), password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{files.ca_key} is not the EC key `reach certs init` writes")
    identity = identity_name(agent_id)
    sans: list[x509.GeneralName] = [x509.DNSName(identity)]
    sans.extend(_host_name(h) for h in names)
    sans.append(x509.UniformResourceIdentifier(agent_uri(agent_id)))
    key = ec.generate_private_key(ec.SECP256R1())
    start = _start(now)
    cert = _leaf(
        ca_cert,
        ca_key,
        key,
        common_name=agent_id,
        sans=sans,
        usage=ExtendedKeyUsageOID.SERVER_AUTH,
        start=start,
        days=days,
    )
    out = out_dir if out_dir is not None else directory / AGENTS_DIR
    out.mkdir(parents=True, exist_ok=True, mode=0o700)
    cert_path, key_path = out / f"{agent_id}.pem", out / f"{agent_id}.key"
    _write_key(key_path, key)
    _write_cert(cert_path, cert)
    return AgentCert(
        agent_id, cert_path, key_path, files.ca_cert, identity, names, cert.not_valid_after_utc
    )


def _start(now: dt.datetime | None) -> dt.datetime:
    # a minute back: a peer whose clock is slightly behind still accepts a fresh cert
    return (now or dt.datetime.now(dt.UTC)) - dt.timedelta(minutes=1)


def _key_usage(*, cert_sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=not cert_sign,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=cert_sign,
        crl_sign=cert_sign,
        encipher_only=False,
        decipher_only=False,
    )


def _leaf(
    ca_cert: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    key: ec.EllipticCurvePrivateKey,
    *,
    common_name: str,
    sans: Sequence[x509.GeneralName],
    usage: x509.ObjectIdentifier,
    start: dt.datetime,
    days: int,
) -> x509.Certificate:
    ca_ski = ca_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    return (
        x509.CertificateBuilder()
        .subject_name(
            x509.Name(
                [
                    x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Agent-Reach"),
                    x509.NameAttribute(NameOID.COMMON_NAME, common_name[:64]),
                ]
            )
        )
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(min(start + dt.timedelta(days=days), ca_cert.not_valid_after_utc))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(cert_sign=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(x509.SubjectAlternativeName(list(sans)), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )


def _host_name(host: str) -> x509.GeneralName:
    text = host.strip("[]")
    try:
        return x509.IPAddress(ipaddress.ip_address(text))
    except ValueError:
        pass
    if not re.fullmatch(r"[A-Za-z0-9*]([A-Za-z0-9.-]{0,252})", text):
        raise ValueError(f"host {host!r} is neither an IP address nor a DNS name")
    return x509.DNSName(text.lower())


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    data = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    _write(path, data, 0o600)


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    _write(path, cert.public_bytes(serialization.Encoding.PEM), 0o644)


def _write(path: Path, data: bytes, mode: int) -> None:
    """Write through a new file renamed into place: a key is never readable by others,
    not even for a moment, and a crash leaves the old file or the new one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as f:
        os.fchmod(fd, mode)  # exactly this mode, whatever the umask
        f.write(data)
        f.flush()
        os.fsync(fd)
    os.replace(tmp, path)
