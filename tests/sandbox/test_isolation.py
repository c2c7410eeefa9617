"""The host's check of what a fresh sandbox sees of the network (sandfleet/worker/sandbox/isolation.py).

Pure cases here; tests/sandbox/test_network.py runs the check against real sandboxes' own views
(and a real bridged one, which it refuses as "none").
"""

from __future__ import annotations

from typing import Any

import pytest

from sandfleet.core.config import SandboxConfig
from sandfleet.worker.sandbox.isolation import describe_network, network_refusal

WORKER_NS = "net:[4026531833]"
RUNC_NONE = {"netns": "net:[4026532183]", "interfaces": ["lo"], "routes": ["lo"]}
GVISOR_NONE = {"netns": "net:[157]", "interfaces": ["lo"], "routes": []}


@pytest.mark.parametrize("view", [RUNC_NONE, GVISOR_NONE])
def test_a_namespace_of_its_own_with_only_loopback_passes(view: dict[str, Any]) -> None:
    assert network_refusal(SandboxConfig(), view, WORKER_NS) is None


@pytest.mark.parametrize(
    ("view", "why"),
    [
        (None, "did not report its network"),
        ("lo", "did not report its network"),
        ({**RUNC_NONE, "netns": None}, "did not report its network namespace"),
        ({**RUNC_NONE, "netns": WORKER_NS}, "shares the worker's network namespace"),
        ({**RUNC_NONE, "interfaces": ["eth0", "lo"]}, "sees interfaces ['eth0', 'lo']"),
        ({**RUNC_NONE, "interfaces": []}, "sees interfaces []"),
        ({**RUNC_NONE, "interfaces": None}, "sees interfaces None"),
        ({**RUNC_NONE, "routes": ["eth0", "lo"]}, "has routes through ['eth0', 'lo']"),
        ({**RUNC_NONE, "routes": None}, "has routes through None"),
    ],
)
def test_anything_more_or_unknown_is_refused(view: Any, why: str) -> None:
    refusal = network_refusal(SandboxConfig(), view, WORKER_NS)
    assert refusal is not None and why in refusal and refusal.endswith("refusing to use it")


def test_restricted_and_full_are_not_held_to_none() -> None:
    bridged = {"netns": "net:[1]", "interfaces": ["eth0", "lo"], "routes": ["eth0", "lo"]}
    for config in (
        SandboxConfig(network="restricted", allow_hosts=["pypi.org"]),
        SandboxConfig(network="full"),
    ):
        assert network_refusal(config, bridged, WORKER_NS) is None


def test_describe_network_says_what_was_asked_made_and_seen() -> None:
    attrs = {"HostConfig": {"NetworkMode": "default"}, "Config": {"NetworkDisabled": True}}
    report = describe_network(SandboxConfig(), RUNC_NONE, attrs)
    assert report == {
        "Requested": "none",
        "NetworkMode": "default",
        "NetworkDisabled": True,
        "Namespace": RUNC_NONE["netns"],
        "NamespaceOfItsOwn": True,
        "Interfaces": ["lo"],
        "RoutesThrough": ["lo"],
        "Verified": True,
    }
