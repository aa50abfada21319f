"""TLS settings read from PEM files: the server's (certificate, key, and the
CA client certificates must chain to for mutual TLS) and the client's
(the CA to trust, and its own certificate and key for mutual TLS).

Files are checked with the standard library before gRPC sees them: gRPC
itself accepts any bytes and fails only at the first handshake, without
naming the file that is wrong."""

from __future__ import annotations

import ssl
from dataclasses import dataclass

import grpc


class TlsConfigError(ValueError):
    """A certificate, key or CA file that cannot be used; the message names
    the flag and the file."""


@dataclass(frozen=True, slots=True)
class ServerTls:
    cert_path: str
    key_path: str
    # With it, clients must present a certificate signed by this CA.
    client_ca_path: str | None = None

    def credentials(self) -> grpc.ServerCredentials:
        key, cert = _key_pair(self.cert_path, self.key_path)
        client_ca = None
        if self.client_ca_path is not None:
            client_ca = _ca("--tls-client-ca", self.client_ca_path)
        return grpc.ssl_server_credentials(
            [(key, cert)],
            root_certificates=client_ca,
            require_client_auth=client_ca is not None,
        )


@dataclass(frozen=True, slots=True)
class ClientTls:
    # None trusts the system's CAs.
    ca_path: str | None = None
    # Both or neither: the client's certificate for mutual TLS.
    cert_path: str | None = None
    key_path: str | None = None

    def credentials(self) -> grpc.ChannelCredentials:
        if (self.cert_path is None) != (self.key_path is None):
            raise TlsConfigError("--tls-cert and --tls-key go together (mutual TLS)")
        ca = None if self.ca_path is None else _ca("--tls-ca", self.ca_path)
        key = cert = None
        if self.cert_path is not None and self.key_path is not None:
            key, cert = _key_pair(self.cert_path, self.key_path)
        return grpc.ssl_channel_credentials(
            root_certificates=ca, private_key=key, certificate_chain=cert
        )


def _read(flag: str, path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise TlsConfigError(f"{flag}: cannot read {path}: {exc.strerror or exc}") from None


def _no_password() -> bytes:
    # An encrypted key would otherwise make OpenSSL prompt on the terminal.
    return b""


def _key_pair(cert_path: str, key_path: str) -> tuple[bytes, bytes]:
    """(key, certificate chain) bytes, after checking they belong together."""
    cert = _read("--tls-cert", cert_path)
    key = _read("--tls-key", key_path)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(cert_path, key_path, password=_no_password)
    except ssl.SSLError as exc:
        if exc.reason == "KEY_VALUES_MISMATCH":
            raise TlsConfigError(
                f"--tls-key: {key_path} is not the private key of --tls-cert {cert_path}"
            ) from None
        raise TlsConfigError(
            f"--tls-cert/--tls-key: {cert_path}, {key_path}: not a PEM certificate chain "
            f"and an unencrypted PEM private key ({exc.reason or exc})"
        ) from None
    return key, cert


def _ca(flag: str, path: str) -> bytes:
    data = _read(flag, path)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    try:
        context.load_verify_locations(cafile=path)
    except ssl.SSLError as exc:
        raise TlsConfigError(
            f"{flag}: {path} holds no PEM CA certificate ({exc.reason or exc})"
        ) from None
    return data
