"""TLS and mutual TLS on the real server, and where plaintext is refused.

A throwaway CA, server and client certificates are made per session with the openssl
command (the `cryptography` package is not a dependency of memsvc).
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from memsvc.config import ConfigError, Settings
from memsvc.embedding import Embedder
from memsvc.server.app import MemsvcServer
from memsvc.server.tls import is_loopback, server_credentials
from memsvc.v1 import memory_pb2 as pb
from memsvc.v1 import memory_pb2_grpc
from tests.conftest import Caller

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")


@dataclass(frozen=True)
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    # Signed by another CA: a certificate the server must not accept.
    rogue_cert: Path
    rogue_key: Path


def _openssl(*args: str | Path) -> None:
    subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True, timeout=60)


def _ca(folder: Path, name: str) -> tuple[Path, Path]:
    key, cert = folder / f"{name}.key", folder / f"{name}.pem"
    _openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", key, "-out", cert, "-days", "2", "-subj", f"/CN={name}",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
    )  # fmt: skip
    return cert, key


def _leaf(folder: Path, name: str, ca: tuple[Path, Path], extensions: str) -> tuple[Path, Path]:
    key, csr, cert = folder / f"{name}.key", folder / f"{name}.csr", folder / f"{name}.pem"
    ext = folder / f"{name}.ext"
    ext.write_text(extensions)
    _openssl(
        "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", key, "-out", csr, "-subj", f"/CN={name}",
    )  # fmt: skip
    _openssl(
        "x509", "-req", "-in", csr, "-CA", ca[0], "-CAkey", ca[1], "-CAcreateserial",
        "-out", cert, "-days", "2", "-extfile", ext,
    )  # fmt: skip
    return cert, key


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    folder = tmp_path_factory.mktemp("pki")
    ca = _ca(folder, "test-ca")
    server = _leaf(
        folder,
        "server",
        ca,
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
    )
    client = _leaf(folder, "client", ca, "extendedKeyUsage=clientAuth\n")
    rogue = _leaf(folder, "rogue", _ca(folder, "rogue-ca"), "extendedKeyUsage=clientAuth\n")
    return Pki(ca[0], *server, *client, *rogue)


StartTls = Callable[..., Awaitable[MemsvcServer]]


@pytest.fixture
async def start_tls(settings: Settings, embedder: Embedder) -> AsyncIterator[StartTls]:
    """Factory: a memsvc on the session's databases with these TLS settings."""
    started: list[MemsvcServer] = []

    async def start(**overrides: Any) -> MemsvcServer:
        srv = MemsvcServer(
            settings.with_overrides(**overrides), embedder=embedder, with_worker=False
        )
        await srv.start()
        started.append(srv)
        return srv

    yield start
    for srv in started:
        await srv.stop(grace_s=1.0)


def _credentials(pki: Pki, *, cert: Path | None = None, key: Path | None = None) -> Any:
    return grpc.ssl_channel_credentials(
        root_certificates=pki.ca.read_bytes(),
        private_key=key.read_bytes() if key else None,
        certificate_chain=cert.read_bytes() if cert else None,
    )


async def _list(channel: grpc.aio.Channel, caller: Caller) -> pb.ListMemoriesResponse:
    stub = memory_pb2_grpc.MemoryServiceStub(channel)
    reply: pb.ListMemoriesResponse = await stub.ListMemories(
        pb.ListMemoriesRequest(scope=pb.Scope(user_id="alice")),
        metadata=(("x-api-key", caller.key),),
        timeout=10,
    )
    return reply


async def test_a_tls_call_works_and_plaintext_gets_nothing(
    pki: Pki, start_tls: StartTls, caller: Caller
) -> None:
    srv = await start_tls(tls_cert_file=pki.server_cert, tls_key_file=pki.server_key)
    target = f"127.0.0.1:{srv.port}"
    async with grpc.aio.secure_channel(target, _credentials(pki)) as channel:
        health = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=10
        )
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        assert list((await _list(channel, caller)).memories) == []
    async with grpc.aio.insecure_channel(target) as plain:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await _list(plain, caller)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_mutual_tls_refuses_a_client_without_a_trusted_certificate(
    pki: Pki, start_tls: StartTls, caller: Caller
) -> None:
    srv = await start_tls(
        tls_cert_file=pki.server_cert,
        tls_key_file=pki.server_key,
        tls_client_ca_file=pki.ca,
        tls_require_client_cert=True,
    )
    target = f"127.0.0.1:{srv.port}"
    for credentials in (
        _credentials(pki),  # no certificate at all
        _credentials(pki, cert=pki.rogue_cert, key=pki.rogue_key),  # another CA's
    ):
        async with grpc.aio.secure_channel(target, credentials) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await _list(channel, caller)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    trusted = _credentials(pki, cert=pki.client_cert, key=pki.client_key)
    async with grpc.aio.secure_channel(target, trusted) as channel:
        assert list((await _list(channel, caller)).memories) == []


async def test_plaintext_off_loopback_is_refused_before_anything_starts(
    settings: Settings, embedder: Embedder
) -> None:
    srv = MemsvcServer(
        settings.with_overrides(grpc_host="0.0.0.0"), embedder=embedder, with_worker=False
    )
    with pytest.raises(ConfigError, match="MEMSVC_ALLOW_PLAINTEXT"):
        await srv.start()
    assert srv.pool is None and srv.port == 0


def test_plaintext_off_loopback_only_when_allowed(settings: Settings) -> None:
    for host in ("0.0.0.0", "::", "10.1.2.3", "memsvc.internal"):
        with pytest.raises(ConfigError, match="refusing plaintext"):
            server_credentials(settings.with_overrides(grpc_host=host))
        assert (
            server_credentials(settings.with_overrides(grpc_host=host, allow_plaintext=True))
            is None
        )
    for host in ("127.0.0.1", "localhost", "::1", "[::1]", "127.0.0.53"):
        assert is_loopback(host), host
        assert server_credentials(settings.with_overrides(grpc_host=host)) is None


def test_inconsistent_tls_settings_name_the_setting(
    pki: Pki, settings: Settings, tmp_path: Path
) -> None:
    tls = {"tls_cert_file": pki.server_cert, "tls_key_file": pki.server_key}
    not_pem = tmp_path / "not.pem"
    not_pem.write_text("hello")
    cases: list[tuple[dict[str, Any], str]] = [
        ({"tls_cert_file": pki.server_cert}, "MEMSVC_TLS_KEY_FILE"),
        ({**tls, "tls_client_ca_file": pki.ca}, "MEMSVC_TLS_REQUIRE_CLIENT_CERT"),
        ({**tls, "tls_require_client_cert": True}, "MEMSVC_TLS_CLIENT_CA_FILE"),
        ({"tls_client_ca_file": pki.ca, "tls_require_client_cert": True}, "need TLS"),
        ({**tls, "tls_key_file": tmp_path / "missing.key"}, "MEMSVC_TLS_KEY_FILE: cannot read"),
        ({**tls, "tls_cert_file": not_pem}, "MEMSVC_TLS_CERT_FILE: .* not a PEM file"),
    ]
    for overrides, message in cases:
        with pytest.raises(ConfigError, match=message):
            server_credentials(settings.with_overrides(**overrides))
    assert server_credentials(settings.with_overrides(**tls)) is not None


def test_tls_settings_from_the_environment(pki: Pki) -> None:
    s = Settings.from_env(
        {
            "MEMSVC_TLS_CERT_FILE": str(pki.server_cert),
            "MEMSVC_TLS_KEY_FILE": str(pki.server_key),
            "MEMSVC_TLS_CLIENT_CA_FILE": str(pki.ca),
            "MEMSVC_TLS_REQUIRE_CLIENT_CERT": "true",
            "MEMSVC_ALLOW_PLAINTEXT": "false",
        }
    )
    assert (s.tls_cert_file, s.tls_key_file, s.tls_client_ca_file) == (
        pki.server_cert,
        pki.server_key,
        pki.ca,
    )
    assert s.tls_require_client_cert and not s.allow_plaintext
    with pytest.raises(ConfigError, match="MEMSVC_ALLOW_PLAINTEXT"):
        Settings.from_env({"MEMSVC_ALLOW_PLAINTEXT": "maybe"})
