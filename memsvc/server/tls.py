"""Transport security: TLS or mutual TLS server credentials, and where plaintext is allowed."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import grpc

from memsvc.config import ConfigError, Settings


def is_loopback(host: str) -> bool:
    """True for localhost and loopback addresses; a name that must be resolved is not."""
    name = host.strip().strip("[]")
    if name.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _read(path: Path, setting: str) -> bytes:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{setting}: cannot read {path} ({exc.strerror})") from None
    if b"-----BEGIN " not in data:
        raise ConfigError(f"{setting}: {path} is not a PEM file")
    return data


def server_credentials(settings: Settings) -> grpc.ServerCredentials | None:
    """Credentials for the gRPC port, or None for plaintext where that is allowed.

    Checked at start, before anything is connected, so a bad combination fails with the
    setting named: plaintext on an address other than loopback needs MEMSVC_ALLOW_PLAINTEXT
    (TLS terminated in front of memsvc); gRPC either requires and verifies client
    certificates or asks for none, so a client CA is used only when they are required.
    """
    cert, key, ca = settings.tls_cert_file, settings.tls_key_file, settings.tls_client_ca_file
    if (cert is None) != (key is None):
        raise ConfigError("MEMSVC_TLS_CERT_FILE and MEMSVC_TLS_KEY_FILE go together")
    if settings.tls_require_client_cert and ca is None:
        raise ConfigError("MEMSVC_TLS_REQUIRE_CLIENT_CERT needs MEMSVC_TLS_CLIENT_CA_FILE")
    if ca is not None and not settings.tls_require_client_cert:
        raise ConfigError(
            "MEMSVC_TLS_CLIENT_CA_FILE is used only with MEMSVC_TLS_REQUIRE_CLIENT_CERT=true "
            "(gRPC cannot verify optional client certificates)"
        )
    if cert is None or key is None:
        if ca is not None:
            raise ConfigError("client certificates need TLS: set MEMSVC_TLS_CERT_FILE / _KEY_FILE")
        if not is_loopback(settings.grpc_host) and not settings.allow_plaintext:
            raise ConfigError(
                f"refusing plaintext gRPC on {settings.grpc_host}, which is not a loopback "
                "address: set MEMSVC_TLS_CERT_FILE and MEMSVC_TLS_KEY_FILE, or "
                "MEMSVC_ALLOW_PLAINTEXT=true when TLS is terminated in front of memsvc"
            )
        return None
    return grpc.ssl_server_credentials(
        [(_read(key, "MEMSVC_TLS_KEY_FILE"), _read(cert, "MEMSVC_TLS_CERT_FILE"))],
        root_certificates=_read(ca, "MEMSVC_TLS_CLIENT_CA_FILE") if ca is not None else None,
        require_client_auth=settings.tls_require_client_cert,
    )
