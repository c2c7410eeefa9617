"""The agent's seccomp filter as written by syscall name: the numbers against the kernel's own
headers (linux-libc-dev, installed by deploy/bootstrap.sh), and the filter program's shape."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from sandfleet_testing import skip_or_fail

from sandfleet.worker.sandbox.inside import syscall_filter

# The kernel's syscall numbers as the C library sees them: x86_64's own table, and the generic one
# that aarch64 uses unchanged.
HEADERS = {
    "x86_64": Path("/usr/include/x86_64-linux-gnu/asm/unistd_64.h"),
    "aarch64": Path("/usr/include/asm-generic/unistd.h"),
}
DEFINE = re.compile(r"^#define __NR_(\w+)\s+(\d+)\s*$", re.MULTILINE)


def kernel_numbers(machine: str) -> dict[str, int]:
    header = HEADERS[machine]
    if not header.exists():
        skip_or_fail(f"{header} is missing (apt-get install linux-libc-dev)")
    return {name: int(number) for name, number in DEFINE.findall(header.read_text())}


@pytest.mark.parametrize("machine", sorted(syscall_filter.SYSCALL_NUMBERS))
def test_each_name_has_the_kernels_number(machine: str) -> None:
    ours = syscall_filter.SYSCALL_NUMBERS[machine]
    kernel = kernel_numbers(machine)
    assert {name: kernel.get(name) for name in ours} == ours


@pytest.mark.parametrize("machine", sorted(syscall_filter.SYSCALL_NUMBERS))
def test_each_table_holds_exactly_the_names_the_filter_uses(machine: str) -> None:
    used = {*syscall_filter.DENIED, syscall_filter.FLAGS_CHECKED, syscall_filter.NOT_IMPLEMENTED}
    assert set(syscall_filter.SYSCALL_NUMBERS[machine]) == used
    assert len(syscall_filter.DENIED) == len(set(syscall_filter.DENIED))


@pytest.mark.parametrize("machine", sorted(syscall_filter.SYSCALL_NUMBERS))
def test_the_program_refuses_each_name_and_jumps_only_forward_to_returns(machine: str) -> None:
    prog = syscall_filter.program(machine)
    numbers = syscall_filter.SYSCALL_NUMBERS[machine]
    ret = syscall_filter.RET_K
    assert len(prog) < 4096 and prog[-1][0] == ret  # BPF_MAXINSNS; the last instruction returns
    for i, (code, jt, jf, _k) in enumerate(prog):
        if code in (syscall_filter.JEQ_K, syscall_filter.JGE_K, syscall_filter.JSET_K):
            assert i + 1 + max(jt, jf) < len(prog)
    refused = {  # the numbers whose equality check jumps to "return EPERM"
        k
        for i, (code, jt, _jf, k) in enumerate(prog)
        if code == syscall_filter.JEQ_K and prog[i + 1 + jt] == (ret, 0, 0, syscall_filter.RET_EPERM)
    }
    assert {numbers[name] for name in syscall_filter.DENIED} <= refused
    assert prog[:3] == [
        (syscall_filter.LD_W_ABS, 0, 0, syscall_filter.ARCH_OFFSET),
        (syscall_filter.JEQ_K, 1, 0, syscall_filter.AUDIT_ARCH[machine]),
        (ret, 0, 0, syscall_filter.RET_EPERM),  # another architecture's ABI: refused
    ]
