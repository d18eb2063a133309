"""Certificates made for a test with the openssl CLI: a CA of the test's own and a server certificate
it signs for one host name, and an https server on 127.0.0.1 serving with it."""

from __future__ import annotations

import http.server
import ssl
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

KEY = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]


@dataclass(frozen=True)
class Certificates:
    ca: Path  # the CA's certificate (PEM): what a client given it trusts
    cert: Path  # the server's certificate, for `host`, signed by the CA
    key: Path
    host: str


def make_certificates(folder: Path, host: str) -> Certificates:
    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=folder, check=True, capture_output=True)

    ca = ["-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign"]
    openssl("req", "-x509", *KEY, *ca, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=test CA")
    openssl("req", *KEY, "-keyout", "server.key", "-out", "server.csr", "-subj", f"/CN={host}")
    (folder / "server.ext").write_text(
        f"subjectAltName=DNS:{host}\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n"
    )
    signed = ["-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-extfile", "server.ext"]
    openssl("x509", "-req", "-in", "server.csr", *signed, "-out", "server.pem", "-days", "2")
    return Certificates(folder / "ca.pem", folder / "server.pem", folder / "server.key", host)


@contextmanager
def https_server(handler: type[http.server.BaseHTTPRequestHandler], certs: Certificates) -> Iterator[int]:
    """A threading https server on 127.0.0.1 (its port), until the block ends."""
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    srv.daemon_threads = True
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(certs.cert, certs.key)
    srv.socket = context.wrap_socket(srv.socket, server_side=True)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield srv.server_address[1]
    finally:
        srv.shutdown()
        srv.server_close()
