"""Wheels for the install tests: pip from Debian's python3-pip-whl (the sandbox images have no pip) and
pure-Python wheels written by hand."""

from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path

from . import skip_or_fail

DEBIAN_WHEELS = Path("/usr/share/python-wheels")  # python3-pip-whl, which python3-venv brings


def pip_wheel() -> Path:
    """The newest pip wheel of this host (skip, or fail in CI, without one)."""
    pips = sorted(DEBIAN_WHEELS.glob("pip-*.whl"))
    if not pips:
        skip_or_fail(f"no pip wheel in {DEBIAN_WHEELS} (apt-get install python3-pip-whl)")
    return pips[-1]


def make_wheel(folder: Path, name: str, version: str, source: str) -> Path:
    """A pure-Python wheel of one module, written by hand (a zip with its dist-info)."""
    dist = f"{name}-{version}"
    files = {
        f"{name}/__init__.py": source.encode(),
        f"{dist}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{dist}.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: sandfleet-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append(f"{dist}.dist-info/RECORD,,")
    files[f"{dist}.dist-info/RECORD"] = ("\n".join(record) + "\n").encode()
    wheel = folder / f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, data in files.items():
            archive.writestr(path, data)
    return wheel


def publish(index: Path, name: str, version: str, source: str) -> Path:
    """Build a wheel and put it on a PEP 503 mirror folder (``index/<name>/``)."""
    folder = index / name
    folder.mkdir(parents=True, exist_ok=True)
    return make_wheel(folder, name, version, source)
