"""Egress proxy cost: HTTPS through Squid (sandfleet/worker/egress/) against the same request made directly.

A test HTTPS service runs in a network namespace of its own (tests/egress/service.py); the proxy is
the worker's own (EgressGateway.prepare: egress network, host rules, Squid), with this host's address
on the egress bridge registered as a client allowed ``api.egress.test``. Both paths run from this
process, interleaved, so the figures are side by side in one run.

    flock /work/bench.lock .venv/bin/python benchmarks/egress.py [--requests 300] [--megabytes 500] [--sandboxes 20]

Latency: a new TCP connection, TLS handshake and ``GET /hello`` per request (through the proxy: the
CONNECT first). Throughput: one connection reading ``/bytes`` to the end. Refusal counters: per
restricted sandbox (runc), its start and stop, and what the counters of refused connections add to
them (sandbox_filter.py): IPv6 routed into the filter at the start, the filter's REJECT counters
read at each take of a run's refusals and once more at the stop. Needs root.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import ssl
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import paired_difference

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

NAME = "api.egress.test"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def open_tls(ctx: ssl.SSLContext, service_ip: str, proxy: tuple[str, int] | None) -> ssl.SSLSocket:
    if proxy is None:
        sock = socket.create_connection((service_ip, 443), timeout=10)
    else:
        sock = socket.create_connection(proxy, timeout=10)
        sock.sendall(f"CONNECT {NAME}:443 HTTP/1.1\r\nHost: {NAME}:443\r\n\r\n".encode())
        reply = b""
        while b"\r\n\r\n" not in reply:
            chunk = sock.recv(4096)
            if not chunk:
                raise RuntimeError(f"the proxy closed the CONNECT: {reply!r}")
            reply += chunk
        if not reply.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(f"the proxy refused: {reply[:80]!r}")
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return ctx.wrap_socket(sock, server_hostname=NAME)


def get(tls: ssl.SSLSocket, path: str, bufsize: int = 262144) -> int:
    """Send GET and read the whole answer; returns the body's bytes."""
    tls.sendall(f"GET {path} HTTP/1.1\r\nHost: {NAME}\r\nConnection: close\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        head += tls.recv(bufsize)
    header, body = head.split(b"\r\n\r\n", 1)
    length = int(
        next(
            line.split(b":")[1]
            for line in header.split(b"\r\n")
            if line.lower().startswith(b"content-length")
        )
    )
    got = len(body)
    while got < length:
        chunk = tls.recv(bufsize)
        if not chunk:
            break
        got += len(chunk)
    return got


def cpu_seconds(pid: int | None) -> float:
    """User + system CPU seconds of a process so far (/proc/PID/stat fields 14 and 15)."""
    if pid is None:
        return 0.0
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def client_cpu_seconds() -> float:
    times = os.times()
    return times.user + times.system


def counter_costs(sandboxes: int) -> dict[str, list[float]]:
    """Milliseconds per restricted sandbox: start (attach included), stop (the last take included),
    and on the same live sandbox, the counters' own steps timed alone."""
    from sandfleet.core.config import SandboxConfig
    from sandfleet.worker.egress.sandbox_filter import refused_packets, route_ipv6_into_filter
    from sandfleet.worker.sandbox.manager import SandboxManager

    config = SandboxConfig(network="restricted", allow_hosts=[NAME])
    costs: dict[str, list[float]] = {"start": [], "stop": [], "ipv6 route": [], "counter read": []}
    with SandboxManager(config) as manager:
        for _ in range(sandboxes + 1):  # the first warms the engine and the image cache: not counted
            began = time.perf_counter()
            session = manager.create_session(labels={"sandfleet.bench": "egress"})
            started = time.perf_counter()
            netns = session._container.handle.egress.netns
            route_ipv6_into_filter(netns)  # done once at attach already: the same steps again
            routed = time.perf_counter()
            if refused_packets(netns) is None:
                raise RuntimeError("the sandbox filter's counters cannot be read")
            read = time.perf_counter()
            session.close()
            stopped = time.perf_counter()
            for label, ms in (
                ("start", started - began),
                ("ipv6 route", routed - started),
                ("counter read", read - routed),
                ("stop", stopped - read),
            ):
                costs[label].append(ms * 1000)
    return {label: values[1:] for label, values in costs.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--megabytes", type=int, default=500)
    parser.add_argument("--transfers", type=int, default=5)
    parser.add_argument("--sandboxes", type=int, default=20, help="restricted sandboxes started and stopped")
    args = parser.parse_args()

    base = Path(tempfile.mkdtemp(prefix="sfeg-bench-", dir="/tmp"))
    os.chmod(base, 0o755)
    os.environ.update(
        SANDFLEET_EGRESS_NETWORK="sfeg-bench", SANDFLEET_EGRESS_BRIDGE="sfegbench0",
        SANDFLEET_EGRESS_SUBNET="10.213.77.0/24", SANDFLEET_EGRESS_STATE_DIR=str(base / "state"),
    )  # fmt: skip
    from egress.service import TestService

    service = TestService.start(base / "service", "bench", 77)
    os.environ["SANDFLEET_EGRESS_HOSTS_FILE"] = str(service.hosts_file)
    # The service is in a private range: the operator lists it, or the destination rule refuses it.
    os.environ["SANDFLEET_EGRESS_ALLOW_DESTINATIONS"] = f"{service.address}/32"
    from sandfleet.worker.egress.gateway import egress_gateway
    from sandfleet.worker.egress.network import remove_host_rules
    from sandfleet.worker.egress.squid import running_pid, stop_proxy
    from sandfleet.worker.sandbox.docker.backend import docker_client

    gateway = egress_gateway()
    client = docker_client()
    try:
        gateway.prepare(client)
        proxy = (gateway.network.gateway, gateway.network.proxy_port)
        # This host reaches the proxy from the bridge's own address: register it like a sandbox.
        (gateway.state_dir / "clients" / proxy[0]).write_text(
            json.dumps({"sandbox": "benchmark", "allow": [NAME]})
        )
        ctx = ssl.create_default_context(cafile=str(service.ca))
        for route in (None, proxy):  # warm both paths
            with open_tls(ctx, service.address, route) as tls:
                get(tls, "/hello")
        latency: dict[str, list[float]] = {"direct": [], "proxy": []}
        for _ in range(args.requests):
            for label, route in (("direct", None), ("proxy", proxy)):
                began = time.perf_counter()
                with open_tls(ctx, service.address, route) as tls:
                    get(tls, "/hello")
                latency[label].append((time.perf_counter() - began) * 1000)
        size = args.megabytes * 1024 * 1024
        throughput: dict[str, list[float]] = {"direct": [], "proxy": []}
        squid_pid = running_pid(gateway.state_dir)
        cpu = {"squid": 0.0, "client": 0.0}  # CPU seconds during the proxy transfers
        for _ in range(args.transfers):
            for label, route in (("direct", None), ("proxy", proxy)):
                with open_tls(ctx, service.address, route) as tls:
                    squid_before, client_before = cpu_seconds(squid_pid), client_cpu_seconds()
                    began = time.perf_counter()
                    got = get(tls, f"/bytes?n={size}")
                    throughput[label].append(got / (time.perf_counter() - began) / 1e6)
                    if route is not None:
                        cpu["squid"] += cpu_seconds(squid_pid) - squid_before
                        cpu["client"] += client_cpu_seconds() - client_before
        counters = counter_costs(args.sandboxes)
    finally:
        stop_proxy(gateway.proxy)
        remove_host_rules(gateway.network)
        try:
            client.api.remove_network(gateway.network.name)
        except Exception:
            pass
        service.stop()
        shutil.rmtree(base, ignore_errors=True)

    p50 = {k: statistics.median(v) for k, v in latency.items()}
    p95 = {k: percentile(v, 0.95) for k, v in latency.items()}
    mbps = {k: statistics.median(v) for k, v in throughput.items()}
    print(f"HTTPS request (new connection + TLS + GET), {args.requests} each, interleaved, ms")
    print(f"  direct  p50 {p50['direct']:.2f}  p95 {p95['direct']:.2f}")
    print(f"  proxy   p50 {p50['proxy']:.2f}  p95 {p95['proxy']:.2f}")
    added, q1, q3 = paired_difference(
        latency["direct"], latency["proxy"]
    )  # each request's pair, side by side
    print(f"  added   p50 {added:+.2f}  paired p25..p75 {q1:+.2f}..{q3:+.2f}  (target: p50 <= 2 ms)")
    print(f"Transfer of {args.megabytes} MB on one connection, median of {args.transfers}, MB/s")
    print(
        f"  direct {mbps['direct']:.0f}  proxy {mbps['proxy']:.0f}  ratio {mbps['proxy'] / mbps['direct']:.2f}  (target >= 0.8)"
    )
    relayed_gb = args.transfers * size / 1e9
    print(
        f"  CPU per GB through the proxy: Squid {cpu['squid'] / relayed_gb:.2f} s, "
        f"the client {cpu['client'] / relayed_gb:.2f} s (the service, on this host too, is not counted)"
    )

    c50 = {k: statistics.median(v) for k, v in counters.items()}
    added = c50["ipv6 route"] + 2 * c50["counter read"]  # a code-action run: one take, one at the stop
    print(f"Refusal counters per restricted sandbox (runc), {args.sandboxes} sandboxes, ms p50 (p95)")
    print("  " + "  ".join(f"{k} {c50[k]:.1f} ({percentile(v, 0.95):.1f})" for k, v in counters.items()))
    print(
        f"  counters' share: IPv6 route + 2 counter reads = {added:.1f} ms of start + stop "
        f"{c50['start'] + c50['stop']:.0f} ms: ratio {added / (c50['start'] + c50['stop']):.3f}"
    )


if __name__ == "__main__":
    main()
