"""The test service's server, run inside its network namespace (tests/egress/service.py).

HTTPS on 443 and 8443 (its own CA's certificate for every name of the service), plain HTTP on 80,
and a bare TCP banner on 22. Paths: ``/hello`` (says which Host it was asked for), ``/redirect?to=URL``
(302), ``/bytes?n=N`` (N bytes, streamed), and a PEP 503 simple index of the wheels in the folder
given as the third argument (``/simple/NAME/`` lists ``INDEX/NAME/*.whl`` with their sha256,
``/packages/NAME/FILE`` serves one): the private mirror of the pip tests. Standard library only.
"""

from __future__ import annotations

import hashlib
import html
import re
import socket
import ssl
import sys
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

CHUNK = b"x" * 65536
INDEX: Path | None = None  # the mirror's folder: INDEX/<normalised name>/<wheel>


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
        if url.path.startswith(("/simple/", "/packages/")):
            self.mirror(url.path)
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

    def mirror(self, path: str) -> None:
        """One page or file of the PEP 503 simple index (404 for anything else)."""
        parts = [p for p in path.split("/") if p]
        project = re.sub(r"[-_.]+", "-", parts[1]).lower() if len(parts) > 1 else ""
        folder = INDEX / project if INDEX is not None and project else None
        body, kind = None, "text/html"
        if folder is not None and folder.is_dir() and parts[0] == "simple" and len(parts) == 2:
            links = []
            for wheel in sorted(folder.glob("*.whl")):
                digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
                name = html.escape(wheel.name)
                links.append(f'<a href="/packages/{project}/{name}#sha256={digest}">{name}</a><br>')
            body = ("<!DOCTYPE html><html><body>" + "".join(links) + "</body></html>").encode()
        elif folder is not None and parts[0] == "packages" and len(parts) == 3 and "/" not in parts[2]:
            wheel = folder / parts[2]
            if wheel.is_file() and wheel.suffix == ".whl":
                body, kind = wheel.read_bytes(), "application/octet-stream"
        if body is None:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", kind)
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
    global INDEX
    cert, key = sys.argv[1], sys.argv[2]
    INDEX = Path(sys.argv[3]) if len(sys.argv) > 3 else None
    for port in (443, 8443):
        threading.Thread(target=serve_tls, args=(port, cert, key), daemon=True).start()
    threading.Thread(target=serve_banner, args=(22,), daemon=True).start()
    server = ThreadingHTTPServer(("0.0.0.0", 80), Handler)
    print("ready", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
