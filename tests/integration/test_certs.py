"""The hub CA (reach.hub.security.certs) and the mTLS link it makes: real files, real handshakes.

The certificates are checked with cryptography's own X.509 path validation (chain, SANs,
extended key usage), then used for real: the SDK's TLS server against the hub's delivery
transport, over loopback sockets.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import stat
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest
import requests
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID
from cryptography.x509.verification import PolicyBuilder, Store, VerificationError

from reach.core.security.trust import HUB_URI, agent_uri, identity_name
from reach.hub.delivery.transports import AgentTransport, HubTls
from reach.hub.security.certs import init_ca, issue_agent_cert
from reach.sdk.tls import TLSConfig, TLSHTTPServer


def load(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def sans(cert: x509.Certificate) -> x509.SubjectAlternativeName:
    return cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value


def ekus(cert: x509.Certificate) -> list[x509.ObjectIdentifier]:
    return list(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def server_verifier(ca: Path, name: x509.GeneralName) -> object:
    builder = PolicyBuilder().store(Store([load(ca)]))
    assert isinstance(name, x509.DNSName | x509.IPAddress)
    return builder.build_server_verifier(name)


def test_init_writes_a_ca_and_a_hub_client_cert_that_chains_to_it(tmp_path: Path) -> None:
    files = init_ca(tmp_path / "certs", hub_name="test-hub")
    ca = load(files.ca_cert)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert ca.subject == ca.issuer  # self-signed root
    # private keys are the owner's alone; the directory too
    assert mode(files.ca_key) == 0o600 and mode(files.hub_key) == 0o600
    assert mode(tmp_path / "certs") == 0o700
    assert b"PRIVATE KEY" not in files.ca_cert.read_bytes()

    hub = load(files.hub_cert)
    assert sans(hub).get_values_for_type(x509.UniformResourceIdentifier) == [HUB_URI]
    assert ekus(hub) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    assert not hub.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    verified = PolicyBuilder().store(Store([ca])).build_client_verifier().verify(hub, [])
    assert x509.UniformResourceIdentifier(HUB_URI) in verified.subjects


def test_an_agent_cert_names_its_agent_its_hosts_and_its_identity(tmp_path: Path) -> None:
    certs = tmp_path / "certs"
    files = init_ca(certs)
    issued = issue_agent_cert(certs, "payments", ["10.0.0.5", "Agent.Example"], days=30)
    assert issued.cert == certs / "agents" / "payments.pem"
    assert mode(issued.key) == 0o600 and issued.ca_cert == files.ca_cert
    cert = load(issued.cert)
    names = sans(cert)
    assert names.get_values_for_type(x509.DNSName) == [identity_name("payments"), "agent.example"]
    assert names.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("10.0.0.5")]
    assert names.get_values_for_type(x509.UniformResourceIdentifier) == [agent_uri("payments")]
    assert ekus(cert) == [ExtendedKeyUsageOID.SERVER_AUTH]
    lifetime = cert.not_valid_after_utc - cert.not_valid_before_utc
    assert dt.timedelta(days=30) <= lifetime <= dt.timedelta(days=30, minutes=2)
    # the chain verifies for the identity name and for every host it was issued for
    for name in (
        x509.DNSName(identity_name("payments")),
        x509.DNSName("agent.example"),
        x509.IPAddress(ipaddress.ip_address("10.0.0.5")),
    ):
        server_verifier(files.ca_cert, name).verify(cert, [])  # type: ignore[attr-defined]
    # ... and not as another agent, nor at another address
    for name in (
        x509.DNSName(identity_name("planner")),
        x509.IPAddress(ipaddress.ip_address("10.0.0.6")),
    ):
        with pytest.raises(VerificationError):
            server_verifier(files.ca_cert, name).verify(cert, [])  # type: ignore[attr-defined]
    # a server certificate is not a client one: an agent cannot pose as the hub with it
    with pytest.raises(VerificationError):
        PolicyBuilder().store(Store([load(files.ca_cert)])).build_client_verifier().verify(cert, [])


def test_default_hosts_are_loopback_and_out_dir_is_honoured(tmp_path: Path) -> None:
    init_ca(tmp_path)
    issued = issue_agent_cert(tmp_path, "dev-agent", out_dir=tmp_path / "elsewhere")
    assert issued.cert.parent == tmp_path / "elsewhere" and issued.hosts == (
        "127.0.0.1",
        "localhost",
    )
    names = sans(load(issued.cert))
    assert "localhost" in names.get_values_for_type(x509.DNSName)
    assert ipaddress.ip_address("127.0.0.1") in names.get_values_for_type(x509.IPAddress)


def test_a_cert_of_another_ca_does_not_verify(tmp_path: Path) -> None:
    init_ca(tmp_path / "ours")
    other = init_ca(tmp_path / "theirs")
    foreign = issue_agent_cert(tmp_path / "theirs", "payments")
    ours = load(tmp_path / "ours" / "ca.pem")
    with pytest.raises(VerificationError):
        PolicyBuilder().store(Store([ours])).build_server_verifier(
            x509.DNSName(identity_name("payments"))
        ).verify(load(foreign.cert), [])
    assert load(other.ca_cert) != ours


def test_init_refuses_to_overwrite_a_ca_unless_forced(tmp_path: Path) -> None:
    files = init_ca(tmp_path)
    before = {p: p.read_bytes() for p in (files.ca_cert, files.ca_key, files.hub_cert)}
    with pytest.raises(FileExistsError, match=r"ca\.pem exists.*--force"):
        init_ca(tmp_path)
    assert {p: p.read_bytes() for p in before} == before  # nothing touched
    (tmp_path / "ca.pem").unlink()
    with pytest.raises(FileExistsError, match=r"ca\.key exists"):  # half a CA is still a CA
        init_ca(tmp_path)
    replaced = init_ca(tmp_path, force=True)
    assert replaced.ca_key.read_bytes() != before[files.ca_key]
    assert mode(replaced.ca_key) == 0o600


def test_issue_needs_a_ca_and_valid_arguments(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="reach certs init"):
        issue_agent_cert(tmp_path, "payments")
    init_ca(tmp_path)
    for agent_id in ("", "../etc/passwd", "a b", "-x"):
        with pytest.raises(ValueError, match="not a valid agent id"):
            issue_agent_cert(tmp_path, agent_id)
    with pytest.raises(ValueError, match="neither an IP address nor a DNS name"):
        issue_agent_cert(tmp_path, "payments", ["bad host!"])
    with pytest.raises(ValueError, match="at least one host"):
        issue_agent_cert(tmp_path, "payments", [" "])
    with pytest.raises(ValueError, match="days"):
        issue_agent_cert(tmp_path, "payments", days=0)
    assert not (tmp_path / "agents" / "payments.pem").exists()


# -- the link: the SDK's TLS server, the hub's delivery transport ------------------------


class Recording(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    runs: list[str]

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.runs.append(self.path)
        body = b'{"code": 0, "data": "ran"}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@contextmanager
def tls_agent(tls: TLSConfig) -> Iterator[tuple[int, list[str]]]:
    runs: list[str] = []
    handler = type("Handler", (Recording,), {"runs": runs})
    server = TLSHTTPServer(("127.0.0.1", 0), handler, tls)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1], runs
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def pki(tmp_path: Path) -> Path:
    init_ca(tmp_path)
    issue_agent_cert(tmp_path, "payments")
    return tmp_path


def agent_tls(pki: Path, agent_id: str = "payments") -> TLSConfig:
    return TLSConfig(
        pki / "agents" / f"{agent_id}.pem", pki / "agents" / f"{agent_id}.key", pki / "ca.pem"
    )


def hub_tls(pki: Path) -> HubTls:
    return HubTls(pki / "ca.pem", pki / "hub.pem", pki / "hub.key")


def test_the_hub_reaches_an_l1_agent_over_mutual_tls(pki: Path) -> None:
    transport = AgentTransport(tls=hub_tls(pki))
    with tls_agent(agent_tls(pki)) as (port, runs):
        answer = transport.post(
            f"https://127.0.0.1:{port}/tasks/pay", {"n": 1}, 2, 2, mtls_agent="payments"
        )
    assert (answer.status, answer.body, answer.refused) == (200, {"code": 0, "data": "ran"}, False)
    assert runs == ["/tasks/pay"]


def test_the_hub_refuses_the_cert_of_another_agent_before_sending(pki: Path) -> None:
    issue_agent_cert(pki, "planner")
    transport = AgentTransport(tls=hub_tls(pki))
    # "planner" answers where the hub means to reach "payments": same CA, wrong identity
    with tls_agent(agent_tls(pki, "planner")) as (port, runs):
        answer = transport.post(
            f"https://127.0.0.1:{port}/tasks/pay", {}, 2, 2, mtls_agent="payments"
        )
    assert answer.refused and answer.error_kind == "tls"
    assert "failed mTLS verification" in (answer.error or "")
    assert runs == []


def test_the_hub_refuses_an_agent_cert_of_another_ca(pki: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    init_ca(other)
    issue_agent_cert(other, "payments")
    transport = AgentTransport(tls=hub_tls(pki))
    # the impostor trusts our hub's client cert, so only the hub's check can stop it
    impostor = TLSConfig(
        other / "agents" / "payments.pem", other / "agents" / "payments.key", pki / "ca.pem"
    )
    with tls_agent(impostor) as (port, runs):
        answer = transport.post(
            f"https://127.0.0.1:{port}/tasks/pay", {}, 2, 2, mtls_agent="payments"
        )
    assert answer.refused and "failed mTLS verification" in (answer.error or "")
    assert runs == []


def test_an_l1_agent_at_http_or_without_hub_certs_is_never_contacted(pki: Path) -> None:
    transport = AgentTransport(tls=hub_tls(pki))
    with tls_agent(agent_tls(pki)) as (port, runs):
        plain = transport.post(
            f"http://127.0.0.1:{port}/tasks/pay", {}, 2, 2, mtls_agent="payments"
        )
        (pki / "hub.key").unlink()
        no_certs = AgentTransport(tls=hub_tls(pki)).post(
            f"https://127.0.0.1:{port}/tasks/pay", {}, 2, 2, mtls_agent="payments"
        )
        unconfigured = AgentTransport().post(
            f"https://127.0.0.1:{port}/tasks/pay", {}, 2, 2, mtls_agent="payments"
        )
    assert plain.refused and "L1 agent requires https + mTLS" in (plain.error or "")
    assert no_certs.refused and "reach certs init" in (no_certs.error or "")
    assert "hub.key" in (no_certs.error or "")
    assert unconfigured.refused and "reach certs init" in (unconfigured.error or "")
    assert runs == []


def test_l2_https_is_verified_as_before(pki: Path) -> None:
    # without the hub CA configured, the hub CA's certs are not trusted for L2 (system CAs)
    with tls_agent(agent_tls(pki)) as (port, runs):
        answer = AgentTransport().post(f"https://127.0.0.1:{port}/tasks/pay", {}, 2, 2)
    assert answer.status is None and not answer.refused
    assert "CERTIFICATE_VERIFY_FAILED" in (answer.error or "")
    assert runs == []


def test_the_agent_serves_only_the_hubs_client_cert(pki: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    init_ca(other)
    url_path = "/tasks/pay"
    with tls_agent(agent_tls(pki)) as (port, runs):
        url = f"https://127.0.0.1:{port}{url_path}"
        attempts = {
            "no client cert": {},
            "another CA's hub cert": {"cert": (str(other / "hub.pem"), str(other / "hub.key"))},
            # right CA, but an agent's (server) cert: not the hub
            "an agent's cert": {
                "cert": (str(pki / "agents/payments.pem"), str(pki / "agents/payments.key"))
            },
        }
        for what, extra in attempts.items():
            with pytest.raises(requests.exceptions.ConnectionError):  # TLS alert or reset
                requests.post(url, json={}, verify=str(pki / "ca.pem"), timeout=5, **extra)  # type: ignore[arg-type]
            assert runs == [], what
        plain = requests.post(f"http://127.0.0.1:{port}{url_path}", json={}, timeout=5)
        assert plain.status_code == 400 and "https with client certificates" in plain.text
        ok = requests.post(
            url,
            json={},
            verify=str(pki / "ca.pem"),
            cert=(str(pki / "hub.pem"), str(pki / "hub.key")),
            timeout=5,
        )
        assert ok.json() == {"code": 0, "data": "ran"}
    assert runs == [url_path]


def test_tls_config_with_unusable_files_is_refused_when_built(tmp_path: Path) -> None:
    from reach.errors import InvalidRegistration

    with pytest.raises(InvalidRegistration, match="tls: cannot load cert"):
        TLSConfig(
            tmp_path / "missing.pem", tmp_path / "missing.key", tmp_path / "ca.pem"
        ).server_context()


def test_an_agent_with_tls_must_be_reached_at_https(pki: Path) -> None:
    import reach
    from reach.errors import InvalidRegistration

    tls = agent_tls(pki)
    for addr, public in (("127.0.0.1:7001", None), ("https://127.0.0.1:7001", "http://h:1")):
        with pytest.raises(InvalidRegistration, match="must be reached at https://") as bad:
            reach.Agent("payments", addr=addr, public_endpoint=public, allow_loopback=True, tls=tls)
        assert bad.value.extra["field"] == ("addr" if public is None else "public_endpoint")
    agent = reach.Agent("payments", addr="https://127.0.0.1:7001", allow_loopback=True, tls=tls)
    assert agent.tls is tls and agent.declaration.addr == "https://127.0.0.1:7001"
