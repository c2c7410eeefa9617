"""Egress proxy cost: HTTPS through Squid (sandfleet/worker/egress/) against the same request made directly.

A test HTTPS service runs in a network namespace of its own (tests/egress/service.py); the proxy is
the worker's own (EgressGateway.prepare: egress network, host rules, Squid), with this host's address
on the egress bridge registered as a client allowed ``api.egress.test``. Both paths run from this
process, interleaved, so the figures are side by side in one run.

    flock /work/bench.lock .venv/bin/python benchmarks/egress.py [--requests 300] [--megabytes 500] [--sandboxes 20]
        [--variant 'NAME=DIRECTIVE; DIRECTIVE' ...] [--throughput-only]

Latency: a new TCP connection, TLS handshake and ``GET /hello`` per request (through the proxy: the
CONNECT first). Throughput: one connection reading ``/bytes`` to the end. Refusal counters: per
restricted sandbox (runc), its start and stop, and what the counters of refused connections add to
them (sandbox_filter.py): IPv6 routed into the filter at the start, the filter's REJECT counters
read at each take of a run's refusals and once more at the stop. Needs root.

``--variant``: one more Squid per variant, the worker's configuration with the directives appended
(ProxyConfig.extra), on its own port and folder; its transfers are interleaved with the others (the
order rotated per round), so a setting is judged against the configuration as it is in the same
run. ``--variant same=`` (nothing appended) is the control: how far two identical proxies differ.
"""

from __future__ import annotations

import argparse
import dataclasses
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
from typing import Any

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


def start_variants(
    gateway: Any, specs: list[str], base: Path, started: dict[str, tuple[Any, tuple[str, int]]]
) -> None:
    """One proxy per ``NAME=DIRECTIVE; DIRECTIVE`` into ``started``: its configuration and address."""
    from sandfleet.worker.egress.squid import ensure_proxy

    for number, spec in enumerate(specs, start=1):
        name, _, directives = spec.partition("=")
        config = dataclasses.replace(
            gateway.proxy,
            port=gateway.proxy.port + number,
            state_dir=base / f"variant-{number}",
            extra=tuple(d.strip() for d in directives.split(";") if d.strip()),
        )
        ensure_proxy(config)
        (config.state_dir / "clients" / config.listen_ip).write_text(
            json.dumps({"sandbox": "benchmark", "allow": [NAME]})
        )
        started[name.strip()] = (config, (config.listen_ip, config.port))


def transfers(
    ctx: ssl.SSLContext,
    address: str,
    routes: dict[str, Any],
    pids: dict[str, int | None],
    size: int,
    count: int,
) -> tuple[dict[str, list[float]], dict[str, float], float]:
    """MB/s per route, interleaved; the proxies' CPU seconds and the client's during the proxied ones."""
    throughput: dict[str, list[float]] = {label: [] for label in routes}
    cpu = dict.fromkeys(pids, 0.0)
    client = 0.0
    labels = list(routes)
    for number in range(count):
        shift = number % len(labels)  # the order rotates per round: no route always follows another
        for label in labels[shift:] + labels[:shift]:
            route = routes[label]
            with open_tls(ctx, address, route) as tls:
                proxy_before, client_before = cpu_seconds(pids.get(label)), client_cpu_seconds()
                began = time.perf_counter()
                got = get(tls, f"/bytes?n={size}")
                throughput[label].append(got / (time.perf_counter() - began) / 1e6)
                if route is not None:
                    cpu[label] += cpu_seconds(pids.get(label)) - proxy_before
                    client += client_cpu_seconds() - client_before
    return throughput, cpu, client


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--megabytes", type=int, default=500)
    parser.add_argument("--transfers", type=int, default=5)
    parser.add_argument("--sandboxes", type=int, default=20, help="restricted sandboxes started and stopped")
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        help="NAME=DIRECTIVE; DIRECTIVE: a Squid with these appended",
    )
    parser.add_argument("--throughput-only", action="store_true", help="no latency, no refusal counters")
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
    variants: dict[str, tuple[Any, tuple[str, int]]] = {}
    try:
        gateway.prepare(client)
        proxy = (gateway.network.gateway, gateway.network.proxy_port)
        # This host reaches the proxy from the bridge's own address: register it like a sandbox.
        (gateway.state_dir / "clients" / proxy[0]).write_text(
            json.dumps({"sandbox": "benchmark", "allow": [NAME]})
        )
        start_variants(gateway, args.variant, base, variants)
        routes: dict[str, Any] = {"direct": None, "proxy": proxy, **{k: v[1] for k, v in variants.items()}}
        pids = {
            "proxy": running_pid(gateway.state_dir),
            **{k: running_pid(v[0].state_dir) for k, v in variants.items()},
        }
        ctx = ssl.create_default_context(cafile=str(service.ca))
        for route in routes.values():  # warm every path
            with open_tls(ctx, service.address, route) as tls:
                get(tls, "/hello")
        latency: dict[str, list[float]] = {"direct": [], "proxy": []}
        for _ in range(0 if args.throughput_only else args.requests):
            for label, route in (("direct", None), ("proxy", proxy)):
                began = time.perf_counter()
                with open_tls(ctx, service.address, route) as tls:
                    get(tls, "/hello")
                latency[label].append((time.perf_counter() - began) * 1000)
        size = args.megabytes * 1024 * 1024
        load_before = os.getloadavg()[0]
        throughput, cpu, client_cpu = transfers(ctx, service.address, routes, pids, size, args.transfers)
        load_after = os.getloadavg()[0]
        counters = {} if args.throughput_only else counter_costs(args.sandboxes)
    finally:
        for config, _address in variants.values():
            stop_proxy(config)
        stop_proxy(gateway.proxy)
        remove_host_rules(gateway.network)
        try:
            client.api.remove_network(gateway.network.name)
        except Exception:
            pass
        service.stop()
        shutil.rmtree(base, ignore_errors=True)

    if latency["direct"]:
        p50 = {k: statistics.median(v) for k, v in latency.items()}
        p95 = {k: percentile(v, 0.95) for k, v in latency.items()}
        print(f"HTTPS request (new connection + TLS + GET), {args.requests} each, interleaved, ms")
        print(f"  direct  p50 {p50['direct']:.2f}  p95 {p95['direct']:.2f}")
        print(f"  proxy   p50 {p50['proxy']:.2f}  p95 {p95['proxy']:.2f}")
        added, q1, q3 = paired_difference(latency["direct"], latency["proxy"])  # each request's pair
        print(f"  added   p50 {added:+.2f}  paired p25..p75 {q1:+.2f}..{q3:+.2f}  (target: p50 <= 2 ms)")
    print_transfers(args, throughput, cpu, client_cpu, (load_before, load_after))
    if counters:
        print_counters(args.sandboxes, counters)


def print_transfers(
    args: argparse.Namespace,
    throughput: dict[str, list[float]],
    cpu: dict[str, float],
    client_cpu: float,
    load: tuple[float, float],
) -> None:
    mbps = {k: statistics.median(v) for k, v in throughput.items()}
    print(
        f"Transfer of {args.megabytes} MB on one connection, median of {args.transfers}, MB/s, interleaved "
        f"(load average {load[0]:.1f} before, {load[1]:.1f} after, {os.cpu_count()} cores); ratios paired "
        "per round (the transfer against the direct one, and the configured proxy's, of the same round)"
    )
    relayed_gb = args.transfers * args.megabytes * 1024 * 1024 / 1e9
    for label, value in mbps.items():
        line = f"  {label:<12} {value:6.0f}"
        if label != "direct":
            paired = [v / d for v, d in zip(throughput[label], throughput["direct"], strict=True)]
            line += f"  ratio {statistics.median(paired):.2f} ({min(paired):.2f}..{max(paired):.2f})"
            if label != "proxy":
                against = [v / p for v, p in zip(throughput[label], throughput["proxy"], strict=True)]
                line += f"  / proxy {statistics.median(against):.2f}"
            line += f"  Squid CPU {cpu[label] / relayed_gb:.2f} s/GB"
        print(line)
    print("  (target: ratio >= 0.8)")
    print(
        f"  the client's CPU per GB proxied: {client_cpu / relayed_gb / max(1, len(cpu)):.2f} s "
        "(the service, on this host too, is not counted)"
    )


def print_counters(sandboxes: int, counters: dict[str, list[float]]) -> None:
    c50 = {k: statistics.median(v) for k, v in counters.items()}
    added = c50["ipv6 route"] + 2 * c50["counter read"]  # a code-action run: one take, one at the stop
    print(f"Refusal counters per restricted sandbox (runc), {sandboxes} sandboxes, ms p50 (p95)")
    print("  " + "  ".join(f"{k} {c50[k]:.1f} ({percentile(v, 0.95):.1f})" for k, v in counters.items()))
    print(
        f"  counters' share: IPv6 route + 2 counter reads = {added:.1f} ms of start + stop "
        f"{c50['start'] + c50['stop']:.0f} ms: ratio {added / (c50['start'] + c50['stop']):.3f}"
    )


if __name__ == "__main__":
    main()
