"""How to reach a MySQL-compatible server: its address, from a `mysql://` URL or a managed server's record.

`ServerAddress` is picklable (worker processes receive it) and opens connections;
`parse_mysql_url` reads the URL a user gives; `is_reachable` tells whether a server answers.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from urllib.parse import parse_qs, unquote, urlparse

import pymysql

from memrl_cli.errors import MemrlError


@dataclass(frozen=True)
class ServerAddress:
    """How to reach a server (picklable, so worker processes can receive it)."""

    user: str = "root"
    password: str = ""
    host: str = "127.0.0.1"
    port: int = 3306
    unix_socket: str | None = None
    tls: bool = False  # encrypt, without verifying the certificate (MySQL 8's password auth needs it over TCP)

    def connect(self, database: str | None = None, *, timeout: float = 60.0) -> pymysql.connections.Connection:
        """Open a new connection (autocommit off, utf8mb4); `timeout` bounds each read and write."""
        context = None
        if self.tls:
            context = ssl.create_default_context()
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        return pymysql.connect(
            ssl=context,
            user=self.user,
            password=self.password,
            host=self.host,
            port=self.port,
            unix_socket=self.unix_socket,
            database=database,
            charset="utf8mb4",
            autocommit=False,
            connect_timeout=10,
            read_timeout=timeout,
            write_timeout=timeout,
        )


def parse_mysql_url(url: str) -> ServerAddress:
    """`mysql://user:password@host:port` to an address.

    Query parameters: `unix_socket=/path` connects through a socket; `ssl=true` encrypts, which
    a MySQL 8 server needs for password logins over TCP (PyMySQL has no RSA support without
    the `cryptography` package).
    """
    parsed = urlparse(url)
    if parsed.scheme not in ("mysql", "mariadb") or not (parsed.hostname or "unix_socket" in parsed.query):
        raise MemrlError(f"bad mysql_url {url!r}: expected mysql://user:password@host:port")
    query = parse_qs(parsed.query)
    socket_path = query.get("unix_socket", [None])[0]
    return ServerAddress(
        tls=query.get("ssl", ["false"])[0].lower() in ("1", "true", "yes"),
        user=unquote(parsed.username or "root"),
        password=unquote(parsed.password or ""),
        host=parsed.hostname or "localhost",
        port=parsed.port or 3306,
        unix_socket=socket_path,
    )


def is_reachable(address: ServerAddress) -> bool:
    """True when a connection to `address` succeeds."""
    try:
        address.connect(timeout=5).close()
    except pymysql.Error:
        return False
    return True
