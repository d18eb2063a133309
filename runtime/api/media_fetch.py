"""The bytes an image part names: a `data:` URL decoded, or an http(s) URL fetched under the
operator's rules (runtime.settings.MediaLimits).

A fetch goes only to a host the operator lists (GEMMA4_MEDIA_ALLOWED_DOMAINS, exact names, as
vLLM's --allowed-media-domains); none listed, nothing is fetched. The host is resolved once, every
address it resolves to is checked (no private, loopback, link-local, multicast or reserved address,
unless GEMMA4_MEDIA_FETCH_PRIVATE_ADDRESSES) and the connection goes to the address checked, so a
second lookup cannot point it elsewhere (DNS rebinding); TLS still verifies the host's own name.
Redirects are refused, not followed (each hop would need the same checks); the body is read raw
(`Accept-Encoding: identity`: a gzip bomb is never inflated) up to the byte limit, and the whole fetch,
connecting to the last byte, within GEMMA4_MEDIA_FETCH_TIMEOUT_S. An https certificate is verified
against certifi's CA bundle, or the operator's own (GEMMA4_MEDIA_FETCH_CA_BUNDLE, for an internal CA);
one that fails is a refusal naming the host."""

from __future__ import annotations

import base64
import binascii
import ipaddress
import socket
import time
import urllib.parse

import certifi
import urllib3

from runtime.log_gate import shown
from runtime.model.media import MediaError
from runtime.settings import MediaLimits

CHUNK_BYTES = 64 * 1024
USER_AGENT = "gemma4-inf2 (media fetch)"
# Ranges that carry another address inside (6to4, NAT64): refused whole, as vLLM does, rather than
# judged by the address they would reach.
TUNNELS = (ipaddress.ip_network("2002::/16"), ipaddress.ip_network("64:ff9b::/96"))


class MediaLimitError(MediaError):
    """A media part over one of the operator's limits (the message names it and its variable)."""


def data_url(url: str, max_bytes: int, limit_name: str) -> tuple[str, bytes]:
    """A base64 `data:` URL (RFC 2397) as (its media type, lower-case, and its bytes). `limit_name`
    is the refusal's text naming the byte limit."""
    head, comma, payload = url[5:].partition(",")
    media_type, _, encoding = head.rpartition(";")
    if not comma or encoding.strip().lower() != "base64":
        raise MediaError("a data: URL must be base64: data:<media type>;base64,<data>")
    payload = "".join(payload.split())  # base64 may be wrapped in lines
    if len(payload) // 4 * 3 > max_bytes + 2:  # checked before decoding: padding aside, 4 characters per 3 bytes
        raise MediaLimitError(f"the data: URL holds about {len(payload) // 4 * 3} bytes; {limit_name}")
    try:
        data = base64.b64decode(payload, validate=True)
    except binascii.Error as exc:
        raise MediaError(f"the data: URL is not valid base64 ({exc})") from None
    if len(data) > max_bytes:
        raise MediaLimitError(f"the data: URL holds {len(data)} bytes; {limit_name}")
    return media_type.partition(";")[0].strip().lower(), data


def blocked(address: str) -> bool:
    """Whether a fetch must not connect to `address`: anything not globally routable (private,
    loopback, link-local with the cloud metadata service, shared, reserved, unspecified), multicast,
    and the tunnel ranges; an IPv4-mapped IPv6 address is judged as its IPv4 one."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])  # an IPv6 scope (fe80::1%eth0) is no part of it
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return not ip.is_global or ip.is_multicast or any(ip in net for net in TUNNELS)


def resolve(host: str, port: int, limits: MediaLimits) -> str:
    """The address to connect to: the first `host` resolves to, once all of them pass `blocked`."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise MediaError(f"the host {shown(host)} could not be resolved ({exc})") from None
    addresses = [str(info[4][0]) for info in infos if info[0] in (socket.AF_INET, socket.AF_INET6)]
    if not addresses:
        raise MediaError(f"the host {shown(host)} has no IPv4 or IPv6 address")
    if not limits.fetch_private_addresses:
        for address in addresses:
            if blocked(address):
                raise MediaError(
                    f"the host {shown(host)} resolves to {address}, a private, loopback, link-local or "
                    "reserved address, which this server does not fetch from "
                    "(the operator may allow it with GEMMA4_MEDIA_FETCH_PRIVATE_ADDRESSES=true)"
                )
    return addresses[0]


def fetch(url: str, limits: MediaLimits, max_bytes: int, limit_name: str) -> bytes:
    """The body an http(s) URL answers with (200 only), under the module's rules."""
    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise MediaError(f"the URL's scheme {shown(scheme)} is not supported; send a data: URL or an http(s) URL")
    if not limits.allowed_domains:
        raise MediaError(
            "this server fetches no URLs; send the image inline as a data: URL (the operator may allow "
            "hosts with GEMMA4_MEDIA_ALLOWED_DOMAINS)"
        )
    try:
        host, port = (parts.hostname or "").rstrip("."), parts.port or (443 if scheme == "https" else 80)
    except ValueError as exc:  # a port that is no number, or out of range
        raise MediaError(f"the URL is not valid ({exc})") from None
    if parts.username is not None or parts.password is not None:
        raise MediaError("the URL must not carry credentials (user:password@)")
    allowed = {d.lower().rstrip(".") for d in limits.allowed_domains}
    if host not in allowed:
        raise MediaError(
            f"the host {shown(host)} is not one this server fetches from; allowed: "
            f"{', '.join(sorted(allowed))} (GEMMA4_MEDIA_ALLOWED_DOMAINS)"
        )
    deadline = time.monotonic() + limits.fetch_timeout_s
    address = resolve(host, port, limits)
    pool = _pool(scheme, address, port, host, _left(deadline, limits), limits)
    target = urllib.parse.urlunsplit(("", "", parts.path or "/", parts.query, ""))
    netloc = f"[{host}]" if ":" in host else host
    headers = {
        "Host": netloc if parts.port is None else f"{netloc}:{port}",
        "User-Agent": USER_AGENT,
        "Accept-Encoding": "identity",
    }
    try:
        response = pool.urlopen(
            "GET", target, headers=headers, redirect=False, retries=False, preload_content=False, decode_content=False
        )
    except urllib3.exceptions.TimeoutError:
        raise MediaLimitError(_late(limits)) from None
    except urllib3.exceptions.SSLError as exc:
        trusted = (
            "GEMMA4_MEDIA_FETCH_CA_BUNDLE's"
            if limits.fetch_ca_bundle
            else "certifi's (GEMMA4_MEDIA_FETCH_CA_BUNDLE names others)"
        )
        raise MediaError(
            f"the host {shown(host)} failed the TLS check ({_tls_reason(exc)}); its certificate must be valid "
            f"for {shown(host)} and signed by a CA this server trusts: {trusted}"
        ) from None
    except urllib3.exceptions.HTTPError as exc:
        raise MediaError(f"fetching {shown(url)} failed: {exc}") from None
    try:
        return _body(response, url, deadline, limits, max_bytes, limit_name)
    finally:
        response.release_conn()
        pool.close()


def _tls_reason(exc: urllib3.exceptions.SSLError) -> str:
    """The TLS library's own reason (certificate verify failed: self-signed ...), not urllib3's wrapping."""
    inner = exc.args[0] if exc.args else exc
    verify = getattr(inner, "verify_message", None)  # ssl.SSLCertVerificationError's
    if verify:
        return f"certificate verify failed: {verify}"
    return " ".join(str(getattr(inner, "reason", None) or inner).split())


def _pool(
    scheme: str, address: str, port: int, host: str, timeout: float, limits: MediaLimits
) -> urllib3.HTTPConnectionPool:
    """A one-connection pool to `address`; for https the certificate is checked against `host`."""
    budget = urllib3.Timeout(connect=timeout, read=timeout)
    if scheme == "http":
        return urllib3.HTTPConnectionPool(address, port, timeout=budget, maxsize=1, retries=False)
    return urllib3.HTTPSConnectionPool(
        address,
        port,
        timeout=budget,
        maxsize=1,
        retries=False,
        cert_reqs="CERT_REQUIRED",
        # the CA bundle requests uses, in every image alike, unless the operator names one
        ca_certs=str(limits.fetch_ca_bundle or certifi.where()),
        server_hostname=host,
        assert_hostname=host,
    )


def _body(response, url: str, deadline: float, limits: MediaLimits, max_bytes: int, limit_name: str) -> bytes:
    status = response.status
    if 300 <= status < 400:
        raise MediaError(f"{shown(url)} answered HTTP {status} (a redirect); redirects are not followed")
    if status != 200:
        raise MediaError(f"{shown(url)} answered HTTP {status}")
    encoding = response.headers.get("Content-Encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):
        raise MediaError(f"{shown(url)} answered with Content-Encoding {shown(encoding)}; only identity is read")
    declared = response.headers.get("Content-Length", "")
    if declared.isdigit() and int(declared) > max_bytes:
        raise MediaLimitError(f"{shown(url)} is {declared} bytes; {limit_name}")
    chunks: list[bytes] = []
    size = 0
    while True:
        # Each read waits no longer than the fetch has left, so a server that trickles bytes is cut
        # off at the deadline, not after one timeout per read.
        sock = getattr(response.connection, "sock", None)
        if sock is not None:
            sock.settimeout(_left(deadline, limits))
        try:
            chunk = response.read(CHUNK_BYTES)
        except urllib3.exceptions.TimeoutError:
            raise MediaLimitError(_late(limits)) from None
        except urllib3.exceptions.HTTPError as exc:
            raise MediaError(f"fetching {shown(url)} failed: {exc}") from None
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > max_bytes:
            raise MediaLimitError(f"{shown(url)} is more than {max_bytes} bytes; {limit_name}")
        chunks.append(chunk)


def _left(deadline: float, limits: MediaLimits) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise MediaLimitError(_late(limits))
    return left


def _late(limits: MediaLimits) -> str:
    return f"the fetch did not finish within {limits.fetch_timeout_s:g} s (GEMMA4_MEDIA_FETCH_TIMEOUT_S)"
