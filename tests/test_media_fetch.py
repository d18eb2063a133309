"""runtime.api.media_fetch: data: URLs, and http(s) fetches against real HTTP and https servers on
127.0.0.1, which only an operator's explicit GEMMA4_MEDIA_FETCH_PRIVATE_ADDRESSES lets the server
reach; the https one has a certificate of a CA made in the test, trusted through
GEMMA4_MEDIA_FETCH_CA_BUNDLE."""

from __future__ import annotations

import base64
import http.server
import re
import socket
import threading
import time

import pytest

from runtime.api.media_fetch import blocked, data_url, fetch
from runtime.model.media import MediaError
from runtime.settings import MediaLimits, ServerSettings, SettingsError
from support.tls import https_server, make_certificates

BODY = b"\x89PNG not really, but bytes" * 10
LIMIT = "the limit is 1000 (GEMMA4_MEDIA_MAX_IMAGE_BYTES)"
LIMIT_RE = re.escape(LIMIT)


class Handler(http.server.BaseHTTPRequestHandler):
    release = threading.Event()  # set at teardown: lets the stalled answer end
    hosts: list[str] = []  # the Host header of every request

    def do_GET(self):
        Handler.hosts.append(self.headers["Host"])
        if self.path == "/ok":
            self._answer(200, BODY, {"Content-Length": str(len(BODY))})
        elif self.path == "/redirect":
            self._answer(302, b"", {"Location": "/ok", "Content-Length": "0"})
        elif self.path == "/big-declared":
            self._answer(200, b"x" * 2000, {"Content-Length": "2000"})
        elif self.path == "/big-undeclared":  # no length: read until the connection closes
            self.close_connection = True
            self._answer(200, b"x" * 5000, {})
        elif self.path == "/gzip":
            self._answer(200, b"\x1f\x8b", {"Content-Encoding": "gzip", "Content-Length": "2"})
        elif self.path == "/stall":  # headers and a few bytes, then nothing until the test ends
            self.send_response(200)
            self.send_header("Content-Length", "100")
            self.end_headers()
            self.wfile.write(b"x" * 10)
            self.wfile.flush()
            Handler.release.wait(30)
        else:
            self._answer(404, b"no", {"Content-Length": "2"})

    def _answer(self, status: int, body: bytes, headers: dict[str, str]):
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def server():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    Handler.release.set()
    srv.shutdown()
    srv.server_close()


def limits(**kw) -> MediaLimits:
    return MediaLimits(**({"allowed_domains": ("127.0.0.1",)} | kw))


def test_the_loopback_server_is_refused_unless_the_operator_allows_private_addresses(server):
    with pytest.raises(MediaError, match="127.0.0.1, a private, loopback.*GEMMA4_MEDIA_FETCH_PRIVATE_ADDRESSES"):
        fetch(f"{server}/ok", limits(), 1000, LIMIT)
    assert fetch(f"{server}/ok", limits(fetch_private_addresses=True), 1000, LIMIT) == BODY


def test_only_listed_hosts_are_fetched(server):
    with pytest.raises(MediaError, match="fetches no URLs.*data: URL.*GEMMA4_MEDIA_ALLOWED_DOMAINS"):
        fetch(f"{server}/ok", MediaLimits(fetch_private_addresses=True), 1000, LIMIT)
    with pytest.raises(MediaError, match="'127.0.0.1' is not one this server fetches from; allowed: example.com"):
        fetch(f"{server}/ok", limits(allowed_domains=("example.com",), fetch_private_addresses=True), 1000, LIMIT)
    for url, why in [
        ("ftp://127.0.0.1/x", "scheme 'ftp' is not supported"),
        ("file:///etc/passwd", "scheme 'file' is not supported"),
        ("http://user:pw@127.0.0.1/ok", "must not carry credentials"),
        ("http://127.0.0.1:99999/ok", "not valid"),
    ]:
        with pytest.raises(MediaError, match=why):
            fetch(url, limits(fetch_private_addresses=True), 1000, LIMIT)


@pytest.mark.parametrize(
    "path,why",
    [
        ("/redirect", "HTTP 302 \\(a redirect\\); redirects are not followed"),
        ("/missing", "HTTP 404"),
        ("/big-declared", f"is 2000 bytes; {LIMIT_RE}"),
        ("/big-undeclared", f"is more than 1000 bytes; {LIMIT_RE}"),
        ("/gzip", "Content-Encoding 'gzip'; only identity"),
    ],
)
def test_what_the_server_answers_is_checked(server, path, why):
    with pytest.raises(MediaError, match=why):
        fetch(f"{server}{path}", limits(fetch_private_addresses=True), 1000, LIMIT)


def test_a_stalled_answer_ends_at_the_fetch_deadline(server):
    began = time.monotonic()
    with pytest.raises(MediaError, match="did not finish within 0.3 s \\(GEMMA4_MEDIA_FETCH_TIMEOUT_S\\)"):
        fetch(f"{server}/stall", limits(fetch_private_addresses=True, fetch_timeout_s=0.3), 1000, LIMIT)
    assert time.monotonic() - began < 2.0


def test_the_connection_goes_to_the_address_that_was_checked(server, monkeypatch):
    """One lookup: a host that would resolve elsewhere the second time (DNS rebinding) is still
    reached at the address checked, and asked for by its own name."""
    port = int(server.rsplit(":", 1)[1])
    answers = iter(["127.0.0.1", "169.254.169.254"])
    real = socket.getaddrinfo

    def lookup(host, *args, **kwargs):
        if host != "media.test":
            return real(host, *args, **kwargs)
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (next(answers), port))]

    monkeypatch.setattr(socket, "getaddrinfo", lookup)
    url = f"http://media.test:{port}/ok"
    assert fetch(url, limits(allowed_domains=("media.test",), fetch_private_addresses=True), 1000, LIMIT) == BODY
    assert Handler.hosts[-1] == f"media.test:{port}"
    with pytest.raises(MediaError, match="169.254.169.254, a private"):  # the next lookup is checked again
        fetch(url, limits(allowed_domains=("media.test",)), 1000, LIMIT)


@pytest.mark.parametrize(
    "address,refused",
    [
        ("127.0.0.1", True),
        ("10.1.2.3", True),
        ("172.16.0.1", True),
        ("192.168.1.1", True),
        ("169.254.169.254", True),  # the cloud metadata service
        ("100.64.0.1", True),  # shared (carrier-grade NAT)
        ("0.0.0.0", True),
        ("224.0.0.1", True),
        ("::1", True),
        ("fe80::1%eth0", True),
        ("fc00::1", True),
        ("::ffff:169.254.169.254", True),
        ("2002:a00:1::1", True),  # 6to4 of 10.0.0.1
        ("64:ff9b::a00:1", True),  # NAT64 of 10.0.0.1
        ("8.8.8.8", False),
        ("2606:4700:4700::1111", False),
    ],
)
def test_blocked_addresses(address, refused):
    assert blocked(address) is refused


def test_data_urls():
    png = base64.b64encode(BODY).decode()
    assert data_url(f"data:image/PNG;base64,{png}", 1000, LIMIT) == ("image/png", BODY)
    assert data_url(f"data:;base64,{png[:8]}\n{png[8:]}", 1000, LIMIT)[1] == BODY  # wrapped lines, no type
    with pytest.raises(MediaError, match="must be base64"):
        data_url("data:image/png,rawbytes", 1000, LIMIT)
    with pytest.raises(MediaError, match="not valid base64"):
        data_url("data:image/png;base64,@@@@", 1000, LIMIT)
    with pytest.raises(MediaError, match=f"holds about 1500 bytes; {LIMIT_RE}"):  # refused before decoding
        data_url("data:image/png;base64," + "A" * 2000, 1000, LIMIT)


TLS_HOST = "images.internal.test"  # the certificate's name; the test's resolver maps *.internal.test to 127.0.0.1


@pytest.fixture(scope="module")
def tls(tmp_path_factory):
    """(certificates, port) of an https server on 127.0.0.1 answering as `Handler` does."""
    certs = make_certificates(tmp_path_factory.mktemp("tls"), TLS_HOST)
    with https_server(Handler, certs) as port:
        yield certs, port


@pytest.fixture
def https(tls, monkeypatch):
    """The https server's base URL by its certificate's name, and limits that reach it, trusting its CA."""
    certs, port = tls
    real = socket.getaddrinfo

    def lookup(host, *args, **kwargs):
        if not host.endswith(".internal.test"):
            return real(host, *args, **kwargs)
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port))]

    monkeypatch.setattr(socket, "getaddrinfo", lookup)
    reach = {"allowed_domains": (TLS_HOST,), "fetch_private_addresses": True}
    return f"https://{TLS_HOST}:{port}", MediaLimits(**reach, fetch_ca_bundle=certs.ca), reach


def test_an_https_fetch_trusts_the_operators_ca_bundle(https):
    base, trusting, _ = https
    assert fetch(f"{base}/ok", trusting, 1000, LIMIT) == BODY
    assert Handler.hosts[-1] == f"{TLS_HOST}:{base.rsplit(':', 1)[1]}"


def test_a_certificate_no_trusted_ca_signed_names_the_host(https):
    """certifi's public roots (the default) do not trust the test's CA: a refusal naming the host and
    the setting, never the body."""
    base, _, reach = https
    why = f"the host '{TLS_HOST}' failed the TLS check \\(.*certificate verify failed.*certifi's.*FETCH_CA_BUNDLE"
    with pytest.raises(MediaError, match=why):
        fetch(f"{base}/ok", MediaLimits(**reach), 1000, LIMIT)


def test_a_certificate_for_another_name_is_refused(https):
    """The connection goes to the address checked, but TLS verifies the name the URL gave: the server's
    certificate, of a trusted CA, does not pass for another name resolving to the same address."""
    base, trusting, _ = https
    other = "other.internal.test"
    limits = trusting.model_copy(update={"allowed_domains": (other,)})
    why = f"'{other}' failed the TLS check .hostname '{other}' doesn't match '{TLS_HOST}'.*CA_BUNDLE's"
    with pytest.raises(MediaError, match=why):
        fetch(base.replace(TLS_HOST, other) + "/ok", limits, 1000, LIMIT)


@pytest.mark.parametrize(
    "path,why",
    [
        ("/redirect", "HTTP 302 \\(a redirect\\); redirects are not followed"),
        ("/big-declared", f"is 2000 bytes; {LIMIT_RE}"),
        ("/big-undeclared", f"is more than 1000 bytes; {LIMIT_RE}"),
    ],
)
def test_what_an_https_server_answers_is_checked(https, path, why):
    base, trusting, _ = https
    with pytest.raises(MediaError, match=why):
        fetch(f"{base}{path}", trusting, 1000, LIMIT)


def test_a_stalled_https_answer_ends_at_the_fetch_deadline(https):
    base, trusting, _ = https
    began = time.monotonic()
    late = trusting.model_copy(update={"fetch_timeout_s": 0.3})
    with pytest.raises(MediaError, match="did not finish within 0.3 s \\(GEMMA4_MEDIA_FETCH_TIMEOUT_S\\)"):
        fetch(f"{base}/stall", late, 1000, LIMIT)
    assert time.monotonic() - began < 2.0


def test_the_ca_bundle_setting_names_a_file(tmp_path):
    environ = {"GEMMA4_ARTIFACT": str(tmp_path), "GEMMA4_MEDIA_FETCH_CA_BUNDLE": str(tmp_path / "missing.pem")}
    with pytest.raises(SettingsError, match="GEMMA4_MEDIA_FETCH_CA_BUNDLE=.*missing.pem"):
        ServerSettings.from_env(environ)
    (tmp_path / "ca.pem").write_text("pem")
    environ["GEMMA4_MEDIA_FETCH_CA_BUNDLE"] = str(tmp_path / "ca.pem")
    assert ServerSettings.from_env(environ).media.fetch_ca_bundle == tmp_path / "ca.pem"
    assert ServerSettings(artifact=tmp_path).media.fetch_ca_bundle is None  # default: certifi's bundle
