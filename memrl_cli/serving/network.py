"""The network rules of a served bank (`memrl mcp`, `memrl proxy`): who may call it, and the HTTP
server both run on.

No web page (`SameOriginGate`: a request carrying an `Origin` header, which browsers add to every
cross-origin POST and CORS preflight, is refused; on loopback, so is a `Host` that is not a loopback
name: DNS rebinding). A server bound to loopback (127.0.0.1, localhost, ::1; the default) serves every
local process; any other address needs a token (`--token` / `MEMRL_TOKEN`, at least 16 characters)
that every HTTP request must carry, in `X-Memrl-Token` or (MCP only) `Authorization: Bearer`.
"""

from __future__ import annotations

import hmac
import json
import socket
import sys
from typing import Any

from memrl_cli.errors import MemrlError

LOOPBACK = ("127.0.0.1", "localhost", "::1")
MIN_TOKEN_LENGTH = 16


def parse_address(address: str) -> tuple[str, int]:
    """`HOST:PORT` (IPv6 in brackets) → (host, port)."""
    host, sep, port = address.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise MemrlError(f"give the address as HOST:PORT (e.g. 127.0.0.1:8766), got {address!r}")
    return host, int(port)


def check_bind(host: str, token: str | None) -> None:
    """Refuse to serve beyond loopback without a token, or with a short one."""
    if token is not None and len(token) < MIN_TOKEN_LENGTH:
        raise MemrlError(f"the token must have at least {MIN_TOKEN_LENGTH} characters "
                         "(e.g. python -c 'import secrets; print(secrets.token_urlsafe())')")
    if host not in LOOPBACK and not token:
        raise MemrlError(f"binding {host} serves the bank beyond this machine: give --token (or MEMRL_TOKEN), "
                         "or bind 127.0.0.1")


class TokenGate:
    """ASGI middleware: every HTTP request must carry the token, else 401 and nothing runs."""

    def __init__(self, app: Any, token: str | None, *, bearer: bool) -> None:
        self.app = app
        self.token = token.encode() if token else None
        self.bearer = bearer

    def _allowed(self, headers: list[tuple[bytes, bytes]]) -> bool:
        assert self.token is not None
        for name, value in headers:
            if name == b"x-memrl-token" and hmac.compare_digest(value, self.token):
                return True
            if self.bearer and name == b"authorization" and value[:7].lower() == b"bearer " \
                    and hmac.compare_digest(value[7:].strip(), self.token):
                return True
        return False

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if self.token is None or scope["type"] != "http" or self._allowed(scope["headers"]):
            await self.app(scope, receive, send)
            return
        where = "X-Memrl-Token" + (" or Authorization: Bearer" if self.bearer else "")
        body = json.dumps({"error": {"type": "Unauthorized",
                                     "message": f"missing or wrong token: send it in {where}"}}).encode()
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


def _refuse(status: int, kind: str, message: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The two ASGI messages of a JSON error answer."""
    body = json.dumps({"error": {"type": kind, "message": message}}).encode()
    return ({"type": "http.response.start", "status": status,
             "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]},
            {"type": "http.response.body", "body": body})


def host_name(value: bytes) -> bytes:
    """A `Host` header's name without its port (`[::1]:8765` → `::1`)."""
    if value.startswith(b"["):
        return value[1:value.find(b"]")] if b"]" in value else value
    return value.rsplit(b":", 1)[0] if b":" in value else value


class SameOriginGate:
    """ASGI middleware for a server that web pages must not use: a request with an `Origin` header
    (browsers send one with every cross-origin POST, `text/plain` ones included, and every CORS preflight)
    or a cross-site `Sec-Fetch-Site` gets 403 with no CORS headers; when bound to loopback, a `Host` that
    is not a loopback name (a DNS-rebinding page on a hostname of its own) gets 421. Nothing runs."""

    def __init__(self, app: Any, host: str) -> None:
        self.app = app
        self.hosts = {name.encode() for name in (*LOOPBACK, host)} if host in LOOPBACK else None

    def _problem(self, headers: list[tuple[bytes, bytes]]) -> tuple[int, str, str] | None:
        for name, value in headers:
            if name == b"origin" or (name == b"sec-fetch-site" and value not in (b"same-origin", b"none")):
                return (403, "Forbidden", f"requests from web pages are refused ({name.decode()}: "
                        f"{value.decode('latin-1')}): this server is for programs, not browsers")
            if name == b"host" and self.hosts is not None:
                if host_name(value) not in self.hosts:
                    return (421, "MisdirectedRequest", f"Host {value.decode('latin-1')!r} is not this server: "
                            "use http://127.0.0.1:PORT (or localhost)")
        return None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        problem = self._problem(scope["headers"]) if scope["type"] == "http" else None
        if problem is None:
            await self.app(scope, receive, send)
            return
        sys.stderr.write(f"memrl: refused {scope.get('method')} {scope.get('path')}: {problem[2]}\n")
        sys.stderr.flush()
        for message in _refuse(*problem):
            await send(message)


def run_http(app: Any, host: str, port: int, what: str, *, own_headers: bool = True) -> None:
    """Serve an ASGI app with uvicorn on HOST:PORT (port 0: any free one), saying where on stderr; without
    `own_headers`, uvicorn adds no `Date` and `Server` (a proxy passes on its upstream's)."""
    import uvicorn

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on sockets whose proto says TCP, and without it each
    # answer (headers, then body: two writes) stalls ~40 ms on the client's delayed ACK (Nagle).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise MemrlError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    sock.listen(128)
    bound = sock.getsockname()[1]
    shown = f"[{host}]" if family == socket.AF_INET6 else host
    sys.stderr.write(f"memrl: {what} listening on http://{shown}:{bound}\n")
    sys.stderr.flush()
    uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=5, server_header=own_headers,
                                  date_header=own_headers)).run(sockets=[sock])
