"""Sandbox images built with no container registry.

The chain, each step cached by a recipe hash stored in the image label ``sandfleet.recipe``:

    debootstrap bookworm minbase (+python3, ca-certificates) ── tar | docker import ─▶ sandfleet/base:bookworm
    deploy/images/sandbox/Dockerfile     (FROM the base)     ── docker build ─▶ sandfleet/sandbox:py3.11
    deploy/images/sandbox-ds/Dockerfile  (FROM the sandbox)  ── docker build ─▶ sandfleet/sandbox-ds:py3.11

A recipe hash covers what decides an image's content: the Dockerfile's text, the build args and the
parent's recipe (so a changed base rebuilds what stands on it); for the base, the debootstrap suite,
variant, packages and what is left out of the tarball. The mirror is not part of it: it decides where
packages come from, not what they are.

With ``base="python-slim"`` the same Dockerfiles build FROM ``python:3.11-slim`` for hosts that reach a
registry; no base image is made then. That path cannot run on a host without a registry, so only the
commands it would run are tested.

The Docker SDK stays in ``sandfleet.worker.sandbox.docker.backend``: this module drives the ``docker`` CLI and
``debootstrap`` with subprocess, and reports failures as ``SandboxError`` with the tool's last words.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import IO, Any

from sandfleet.core.errors import SandboxError
from sandfleet.core.sizes import format_size

BASE_TAG = "sandfleet/base:bookworm"
SANDBOX_TAG = "sandfleet/sandbox:py3.11"
DATA_SCIENCE_TAG = "sandfleet/sandbox-ds:py3.11"
PYTHON_SLIM_IMAGE = "python:3.11-slim"
LABEL_RECIPE = "sandfleet.recipe"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
BASES = ("debian", "python-slim")
RECIPES_DIR = Path(__file__).resolve().parents[3] / "deploy" / "images"
ERROR_TAIL_LINES = 25

# Left out of the imported root filesystem: package caches, apt lists, documentation.
ROOTFS_EXCLUDES = (
    "./var/cache/apt/archives/*.deb",
    "./var/lib/apt/lists/*",
    "./usr/share/doc/*",
    "./usr/share/man/*",
    "./usr/share/info/*",
    "./usr/share/locale/*",
)
# Applied by `docker import`: an imported tarball carries no config of its own.
IMPORT_CHANGES = (
    "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    'CMD ["python3"]',
)


@dataclass(frozen=True)
class DebootstrapParams:
    """What ``debootstrap`` makes. ``mirror`` is where from; it is not part of the recipe."""

    suite: str = "bookworm"
    variant: str = "minbase"
    include: tuple[str, ...] = ("python3", "ca-certificates")
    mirror: str = DEFAULT_MIRROR
    keyring: str | None = None

    def recipe_inputs(self) -> dict[str, object]:
        return {
            "suite": self.suite,
            "variant": self.variant,
            "include": sorted(self.include),
            "excludes": list(ROOTFS_EXCLUDES),
            "changes": list(IMPORT_CHANGES),
        }


@dataclass(frozen=True)
class ImageStep:
    """One image to make: imported from a debootstrap tree (``dockerfile`` None) or built."""

    name: str  # "base" | "sandbox" | "sandbox-ds"
    tag: str
    recipe: str
    dockerfile: Path | None = None
    build_args: Mapping[str, str] = field(default_factory=dict)


class BuildStatus(StrEnum):
    """What ``build_images`` did with one image."""

    BUILT = "built"
    SKIPPED = "skipped"  # its recipe label matched: unchanged, not rebuilt


@dataclass(frozen=True)
class BuildResult:
    """The outcome for one image. ``seconds`` is 0 for a skipped image."""

    name: str
    tag: str
    status: BuildStatus
    recipe: str
    seconds: float
    size_bytes: int

    def as_dict(self) -> dict[str, object]:
        return {**self.__dict__, "size": format_size(self.size_bytes, rounded=True)}


# ---- pure part: recipes, plans and command lines ---------------------------------------------------


def recipe_hash(inputs: Mapping[str, object]) -> str:
    """sha256 over a canonical JSON form of the recipe inputs."""
    text = json.dumps(inputs, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def base_recipe(params: DebootstrapParams) -> str:
    return recipe_hash({"kind": "debootstrap", **params.recipe_inputs()})


def dockerfile_recipe(dockerfile_text: str, build_args: Mapping[str, str], parent: str) -> str:
    """``parent`` is the parent's recipe hash, or its image name when it comes from a registry."""
    return recipe_hash({"dockerfile": dockerfile_text, "build_args": dict(build_args), "parent": parent})


def mirror_from_apt_sources(texts: Iterable[str]) -> str | None:
    """The first Debian archive URI in apt source files (one-line ``deb URI suite`` or deb822 ``URIs:``).

    Only URIs whose path ends in ``/debian`` count: an Ubuntu host's mirror has no bookworm.
    """
    for text in texts:
        for line in text.splitlines():
            line = line.split("#", 1)[0].strip()
            m = re.match(r"^deb\s+(?:\[[^\]]*\]\s+)?(\S+)", line) or re.match(r"^URIs:\s*(.+)$", line)
            if not m:
                continue
            for uri in m.group(1).split():
                if uri.rstrip("/").endswith("/debian"):
                    return uri.rstrip("/")
    return None


def plan_images(
    base: str = "debian",
    data_science: bool = False,
    params: DebootstrapParams | None = None,
    recipes_dir: Path = RECIPES_DIR,
) -> list[ImageStep]:
    """The images to make, parents first, each with its recipe hash."""
    if base not in BASES:
        raise SandboxError(f"unknown base {base!r}: use one of {', '.join(BASES)}")
    params = params or DebootstrapParams()
    steps: list[ImageStep] = []
    if base == "debian":
        base_step = ImageStep("base", BASE_TAG, base_recipe(params))
        steps.append(base_step)
        parent_image, parent_recipe = BASE_TAG, base_step.recipe
    else:
        parent_image = parent_recipe = PYTHON_SLIM_IMAGE
    sandbox_file = recipes_dir / "sandbox" / "Dockerfile"
    sandbox_args = {"BASE_IMAGE": parent_image}
    sandbox = ImageStep(
        "sandbox",
        SANDBOX_TAG,
        dockerfile_recipe(_read(sandbox_file), sandbox_args, parent_recipe),
        sandbox_file,
        sandbox_args,
    )
    steps.append(sandbox)
    if data_science:
        ds_file = recipes_dir / "sandbox-ds" / "Dockerfile"
        ds_args = {"SANDBOX_IMAGE": SANDBOX_TAG, "DS_PACKAGES_FROM": "apt" if base == "debian" else "pip"}
        steps.append(
            ImageStep(
                "sandbox-ds",
                DATA_SCIENCE_TAG,
                dockerfile_recipe(_read(ds_file), ds_args, sandbox.recipe),
                ds_file,
                ds_args,
            )
        )
    return steps


def debootstrap_command(params: DebootstrapParams, target: Path) -> list[str]:
    cmd = ["debootstrap", f"--variant={params.variant}", f"--include={','.join(params.include)}"]
    if params.keyring:
        cmd.append(f"--keyring={params.keyring}")
    return [*cmd, params.suite, str(target), params.mirror]


def tar_command(rootfs: Path) -> list[str]:
    excludes = [f"--exclude={pattern}" for pattern in ROOTFS_EXCLUDES]
    return ["tar", "-C", str(rootfs), "--numeric-owner", *excludes, "-c", "."]


def import_command(step: ImageStep) -> list[str]:
    changes = [*IMPORT_CHANGES, f"LABEL {LABEL_RECIPE}={step.recipe}"]
    return ["docker", "import", *(arg for c in changes for arg in ("--change", c)), "-", step.tag]


def build_command(step: ImageStep) -> list[str]:
    assert step.dockerfile is not None
    args = [arg for key, value in step.build_args.items() for arg in ("--build-arg", f"{key}={value}")]
    return [
        "docker", "build", "--force-rm", *args,
        "--label", f"{LABEL_RECIPE}={step.recipe}",
        "-t", step.tag, "-f", str(step.dockerfile), str(step.dockerfile.parent),
    ]  # fmt: skip


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError as e:
        raise SandboxError(f"image recipe {path} is missing ({e.strerror}); is this a full checkout?") from e


# ---- side effects: the docker CLI and debootstrap ------------------------------------------------


def default_mirror() -> str:
    """This host's Debian mirror when apt has one, else deb.debian.org."""
    files = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
    texts = []
    for path in files:
        try:
            texts.append(path.read_text())
        except OSError:
            continue
    return mirror_from_apt_sources(texts) or DEFAULT_MIRROR


def default_keyring() -> str | None:
    """Debian's archive keyring if installed (needed by debootstrap on Ubuntu hosts)."""
    path = "/usr/share/keyrings/debian-archive-keyring.gpg"
    return path if os.path.exists(path) else None


def check_docker() -> None:
    """The docker CLI is installed and an engine answers it."""
    if shutil.which("docker") is None:
        raise SandboxError(
            "the docker command is not installed; run deploy/bootstrap.sh (or install docker.io)"
        )
    proc = _run(["docker", "version", "--format", "{{.Server.Version}}"], check=False)
    if proc.returncode != 0:
        raise SandboxError(
            f"Docker engine not reachable: {_tail(proc.stdout)}. Make sure Docker is installed and running."
        )


def check_debootstrap() -> None:
    if shutil.which("debootstrap") is None:
        raise SandboxError(
            "debootstrap is not installed; it makes the base image with no registry. "
            "Install it (apt-get install debootstrap), or use --base python-slim where a registry is "
            "reachable."
        )
    if os.geteuid() != 0:
        raise SandboxError(
            "building the base image needs root (debootstrap creates a root filesystem); run as root"
        )


def inspect_image(tag: str) -> tuple[str, str, int] | None:
    """(image id, recipe label or "", size in bytes) of a local image, or None if absent."""
    proc = _run(["docker", "image", "inspect", tag], check=False)
    if proc.returncode != 0:
        return None
    data = json.loads(proc.stdout)[0]
    labels = (data.get("Config") or {}).get("Labels") or {}
    return data["Id"], labels.get(LABEL_RECIPE, ""), int(data.get("Size", 0))


def build_images(
    steps: list[ImageStep],
    if_changed: bool = False,
    params: DebootstrapParams | None = None,
    rootfs: Path | None = None,
    progress: Callable[[str], None] = lambda _msg: None,
    builders: Mapping[str, Callable[[ImageStep], None]] | None = None,
) -> list[BuildResult]:
    """Make each image of the plan, parents first; with ``if_changed`` skip those whose label matches.

    ``rootfs`` imports an existing debootstrap tree instead of making one (air-gapped sites that ship
    a tree, and development). Replaced images are removed when nothing uses them any more.
    ``builders`` (step name -> function) build the steps they name their own way (custom images:
    sandfleet/worker/images/custom.py).
    """
    check_docker()
    params = params or DebootstrapParams()
    results: list[BuildResult] = []
    replaced: list[str] = []
    for step in steps:
        found = inspect_image(step.tag)
        if if_changed and found and found[1] == step.recipe:
            results.append(BuildResult(step.name, step.tag, BuildStatus.SKIPPED, step.recipe, 0.0, found[2]))
            continue
        progress(f"{step.tag}: building")
        started = time.monotonic()
        if builders and step.name in builders:
            builders[step.name](step)
        elif step.dockerfile is None:
            _import_base(step, params, rootfs, progress)
        else:
            _run(build_command(step), env={"DOCKER_BUILDKIT": "0"})  # the classic builder ships everywhere
        seconds = time.monotonic() - started
        now = inspect_image(step.tag)
        if now is None:
            raise SandboxError(f"{step.tag} was built but is not listed by the engine")
        if found and found[0] != now[0]:
            replaced.append(found[0])
        results.append(BuildResult(step.name, step.tag, BuildStatus.BUILT, step.recipe, seconds, now[2]))
        progress(f"{step.tag}: built in {seconds:.1f} s, {format_size(now[2], rounded=True)}")
    for image_id in reversed(replaced):  # children first; images still in use stay
        _run(["docker", "image", "rm", image_id], check=False)
    return results


def _import_base(
    step: ImageStep, params: DebootstrapParams, rootfs: Path | None, progress: Callable[[str], None]
) -> None:
    if rootfs is not None:
        _import_tree(step, rootfs)
        return
    check_debootstrap()
    workdir = Path(tempfile.mkdtemp(prefix="sandfleet-rootfs-", dir="/var/tmp"))
    try:
        progress(f"{step.tag}: debootstrap {params.suite} from {params.mirror} (a few minutes)")
        _run(debootstrap_command(params, workdir / "rootfs"))
        _import_tree(step, workdir / "rootfs")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _import_tree(step: ImageStep, rootfs: Path) -> None:
    if not (rootfs / "usr" / "bin" / "python3").exists():
        raise SandboxError(f"{rootfs} is not a root filesystem with python3")
    with tempfile.TemporaryFile() as tar_errors:
        tar = subprocess.Popen(tar_command(rootfs), stdout=subprocess.PIPE, stderr=tar_errors)
        try:
            _run(import_command(step), stdin=tar.stdout)
        finally:
            assert tar.stdout is not None
            tar.stdout.close()
            tar.wait()
        if tar.returncode != 0:  # the import may have taken a truncated stream: do not keep it
            _run(["docker", "image", "rm", step.tag], check=False)
            tar_errors.seek(0)
            raise SandboxError(
                f"tar of {rootfs} failed:\n{_tail(tar_errors.read().decode(errors='replace'))}"
            )


def _run(
    cmd: list[str],
    check: bool = True,
    env: Mapping[str, str] | None = None,
    stdin: IO[Any] | int | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run a command, output captured; a failure raises SandboxError with its last lines."""
    try:
        proc = subprocess.run(
            cmd,
            stdin=stdin,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, **env} if env else None,
        )
    except FileNotFoundError as e:
        raise SandboxError(f"{cmd[0]} is not installed") from e
    if check and proc.returncode != 0:
        raise SandboxError(
            f"`{' '.join(cmd[:3])} ...` failed (exit {proc.returncode}):\n{_tail(proc.stdout)}"
        )
    return proc


run_command = _run  # for the builders of other images (sandfleet/worker/images/custom.py)


def _tail(output: str, lines: int = ERROR_TAIL_LINES) -> str:
    return "\n".join(output.strip().splitlines()[-lines:]) or "no output"
