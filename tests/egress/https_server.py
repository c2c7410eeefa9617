"""The test service's server, run inside its network namespace (tests/egress/service.py).

HTTPS on 443 and 8443 (its own CA's certificate for every name of the service), plain HTTP on 80,
and a bare TCP banner on 22. Paths: ``/hello`` (says which Host it was asked for), ``/redirect?to=URL``
(302), ``/bytes?n=N`` (N bytes, streamed), ``/simple/...`` (a tiny package index for pip tests is not
served: pip tests use the real PyPI). Standard library only.
"""

from __future__ import annotations

import socket
import ssl
import sys
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

CHUNK = b"x" * 65536


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        url = urllib.parse.urlsplit(self.path)
        query = urllib.parse.parse_qs(url.query)
        if url.path == "/redirect":
            self.send_response(302)
            self.send_header("Location", query["to"][0])
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if url.path == "/bytes":
            n = int(query["n"][0])
            self.send_response(200)
            self.send_header("Content-Length", str(n))
            self.end_headers()
            while n > 0:
                piece = CHUNK[: min(n, len(CHUNK))]
                self.wfile.write(piece)
                n -= len(piece)
            return
        body = f"hello from {self.headers.get('Host', '?')} on port {self.server.server_address[1]}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


def serve_tls(port: int, cert: str, key: str) -> None:
    server = ThreadingHTTPServer(("0.0.0.0", port), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    server.serve_forever()


def serve_banner(port: int) -> None:
    listener = socket.create_server(("0.0.0.0", port))
    while True:
        conn, _ = listener.accept()
        conn.sendall(b"SSH-2.0-sandfleet-test\r\n")
        conn.close()


def main() -> None:
    cert, key = sys.argv[1], sys.argv[2]
    for port in (443, 8443):
        threading.Thread(target=serve_tls, args=(port, cert, key), daemon=True).start()
    threading.Thread(target=serve_banner, args=(22,), daemon=True).start()
    server = ThreadingHTTPServer(("0.0.0.0", 80), Handler)
    print("ready", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
