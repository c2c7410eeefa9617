"""Wheels for the install and mirror tests: pip from Debian's python3-pip-whl (the sandbox images have
no pip) and pure-Python wheels written by hand, put on a PEP 503 mirror folder."""

from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path

DEBIAN_WHEELS = Path("/usr/share/python-wheels")  # python3-pip-whl, which python3-venv brings


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
    """Build a wheel and put it on the mirror (``index/<name>/``)."""
    folder = index / name
    folder.mkdir(parents=True, exist_ok=True)
    return make_wheel(folder, name, version, source)
