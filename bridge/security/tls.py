"""Server-side transport security: gRPC and HTTP credentials from PEM files, the loopback test, and
the `--insecure` rule.

    creds = server_credentials(TlsFiles(cert=Path("certs/server.crt"), key=Path("certs/server.key"),
                                        client_ca=Path("certs/ca.crt")))     # client_ca: mTLS, certs required
    port = server.add_secure_port("0.0.0.0:50051", creds)
    check_exposure("0.0.0.0", tls=True, insecure=False)                      # raises InsecureBind without TLS
    ctx = http_ssl_context(files)                                            # the console's HTTPS (certs optional)
"""

from __future__ import annotations

import logging
import ssl
import sys
from dataclasses import dataclass
from pathlib import Path

import grpc

from bridge.common.net import is_loopback

log = logging.getLogger("tether.security")


class InsecureBind(RuntimeError):
    """A plaintext server on a non-loopback address without `--insecure`."""


@dataclass(frozen=True, kw_only=True)
class TlsFiles:
    cert: Path                    # the server's certificate chain (PEM)
    key: Path                     # its private key (PEM)
    client_ca: Path | None = None  # clients must present a certificate signed by this CA (mTLS)

    def __post_init__(self):
        for name in ("cert", "key", "client_ca"):
            path = getattr(self, name)
            if path is not None and not Path(path).is_file():
                raise FileNotFoundError(f"TLS {name.replace('_', ' ')} file not found: {path}")

    def read(self) -> tuple[bytes, bytes, bytes | None]:
        return (Path(self.cert).read_bytes(), Path(self.key).read_bytes(),
                Path(self.client_ca).read_bytes() if self.client_ca else None)


def server_credentials(files: TlsFiles) -> grpc.ServerCredentials:
    """TLS for a gRPC server; with `client_ca`, every client must present a certificate it signed."""
    cert, key, ca = files.read()
    return grpc.ssl_server_credentials([(key, cert)], root_certificates=ca, require_client_auth=ca is not None)


def http_ssl_context(files: TlsFiles, *, require_client_cert: bool = False) -> ssl.SSLContext:
    """TLS for an HTTP server (the console). With `client_ca`, client certificates are verified when
    sent (optional unless `require_client_cert`): browsers may log in with a token instead."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(files.cert, files.key)
    if files.client_ca is not None:
        ctx.load_verify_locations(cafile=str(files.client_ca))
        ctx.verify_mode = ssl.CERT_REQUIRED if require_client_cert else ssl.CERT_OPTIONAL
    return ctx


def check_exposure(host: str, *, tls: bool, insecure: bool, what: str = "gateway") -> None:
    """Refuse plaintext on a non-loopback address unless `insecure`; warn loudly when it is allowed."""
    if tls or is_loopback(host):
        return
    if not insecure:
        raise InsecureBind(f"refusing to serve the {what} without TLS on {host!r}, which is not a loopback "
                           f"address: give --tls-cert/--tls-key (see `tether certs init`), bind 127.0.0.1, "
                           f"or pass --insecure to accept plaintext, unauthenticated traffic on the network")
    banner = "!" * 100
    message = (f"INSECURE: the {what} serves PLAINTEXT on {host!r} (--insecure): anyone on that network can "
               f"connect, read observations and actions, and impersonate robots")
    log.warning("%s", banner)
    log.warning("%s", message)
    log.warning("%s", banner)
    print(f"{banner}\n{message}\n{banner}", file=sys.stderr, flush=True)
