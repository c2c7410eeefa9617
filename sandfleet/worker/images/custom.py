"""Custom sandbox images: the sandbox image plus packages an operator names, built with no registry.

    sandfleet images build --name geo --pip shapely==2.0.6 --apt libgeos-c1v5
        -> sandfleet/custom-geo:py3.11, FROM sandfleet/sandbox:py3.11 (deploy/images/custom/Dockerfile)

The image stands on the local sandbox image, so it has the same user, paths and environment, and runs
under the same hardening (that is decided per container, sandfleet/worker/sandbox/docker/spec.py). Debian packages come
from the distribution mirror during the build (as the data-science image's do). Python packages come
from the package index through the build host's own pip (its index, proxy and certificates), as wheels
for the image's Python only (``--only-binary=:all:``): no package's code runs on the host or in the
build, and the image gets no pip. A name the index does not know fails the build with pip's message,
before Docker is asked for anything; Docker tags an image only when its build succeeded, so nothing
half-built is ever tagged.

The recipe hash (label ``sandfleet.recipe``) covers the Dockerfile, the sorted package lists and the
sandbox image's recipe: the same recipe is skipped as unchanged. Versions not pinned are resolved when
the image is built; pin them (``six==1.17.0``) for an image that says exactly what it holds.

Jobs may use the image once the operator's policy allows it: ``SANDFLEET_POLICY_IMAGES`` takes exact
names and ``*`` patterns (``sandfleet/custom-*:py3.11`` allows every custom image).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path

from sandfleet.core.errors import InvalidSpecError, SandboxError
from sandfleet.worker.images.build import (
    ERROR_TAIL_LINES,
    RECIPES_DIR,
    SANDBOX_TAG,
    ImageStep,
    dockerfile_recipe,
    plan_images,
    run_command,
)

CUSTOM_PREFIX = "sandfleet/custom-"
PYTHON_VERSION = "3.11"  # the sandbox image's python3 (Debian bookworm)
WHEEL_PLATFORM = "manylinux2014_x86_64"
LABEL_CUSTOM = "sandfleet.custom"
LABEL_PACKAGES = "sandfleet.packages"
SITE_PACKAGES = "site-packages"
PIP_TIMEOUT_S = 600

_IMAGE_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")
# A requirement as pip takes it, restricted to what a name, extras and version pins need: no options
# (nothing starts with "-"), no URLs, paths, markers or spaces.
_PIP_REQUIREMENT = re.compile(
    r"^[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9._,-]+\])?((===|==|>=|<=|~=|!=|>|<)[A-Za-z0-9.*+!_-]+"
    r"(,(===|==|>=|<=|~=|!=|>|<)[A-Za-z0-9.*+!_-]+)*)?$"
)
_APT_PACKAGE = re.compile(r"^[a-z0-9][a-z0-9+.-]+(=[A-Za-z0-9.+~:-]+)?$")


def custom_tag(name: str) -> str:
    return f"{CUSTOM_PREFIX}{name}:py{PYTHON_VERSION}"


def check_request(name: str, pip: Iterable[str], apt: Iterable[str]) -> tuple[list[str], list[str]]:
    """The package lists, deduplicated and sorted; InvalidSpecError naming what cannot be asked for."""
    if not _IMAGE_NAME.match(name):
        raise InvalidSpecError(
            f"image name {name!r}: use 1-63 lowercase letters, digits and ._- (starting with a letter or digit)"
        )
    pip_list, apt_list = sorted(set(pip)), sorted(set(apt))
    if not pip_list and not apt_list:
        raise InvalidSpecError("a custom image needs at least one --pip or --apt package")
    bad = [p for p in pip_list if not _PIP_REQUIREMENT.match(p)]
    if bad:
        raise InvalidSpecError(
            f"--pip {', '.join(map(repr, bad))}: give a package name, optionally with extras and version "
            "pins (six, six==1.17.0, requests[socks]>=2.31); options, URLs and paths are not accepted"
        )
    bad = [p for p in apt_list if not _APT_PACKAGE.match(p)]
    if bad:
        raise InvalidSpecError(
            f"--apt {', '.join(map(repr, bad))}: give Debian package names (optionally =version)"
        )
    return pip_list, apt_list


def plan_custom_image(
    name: str, pip: Iterable[str], apt: Iterable[str], recipes_dir: Path = RECIPES_DIR
) -> list[ImageStep]:
    """The base and sandbox images, then the custom image, each with its recipe hash."""
    pip_list, apt_list = check_request(name, pip, apt)
    steps = plan_images("debian", False, recipes_dir=recipes_dir)
    sandbox = next(s for s in steps if s.tag == SANDBOX_TAG)
    dockerfile = recipes_dir / "custom" / "Dockerfile"
    try:
        text = dockerfile.read_text()
    except OSError as e:
        raise SandboxError(
            f"image recipe {dockerfile} is missing ({e.strerror}); is this a full checkout?"
        ) from e
    args = {
        "SANDBOX_IMAGE": SANDBOX_TAG,
        "APT_PACKAGES": " ".join(apt_list),
        "PIP_PACKAGES": " ".join(pip_list),
    }
    steps.append(
        ImageStep(
            f"custom-{name}",
            custom_tag(name),
            dockerfile_recipe(text, args, sandbox.recipe),
            dockerfile,
            args,
        )
    )
    return steps


def pip_target_command(packages: list[str], target: Path, index_url: str | None = None) -> list[str]:
    """The host pip's command that puts the wheels of ``packages`` (and their dependencies) for the
    image's Python into ``target``."""
    cmd = [
        sys.executable, "-m", "pip", "install", "--no-input", "--disable-pip-version-check",
        "--target", str(target), "--no-compile", "--only-binary=:all:",
        "--platform", WHEEL_PLATFORM, "--python-version", PYTHON_VERSION,
        "--implementation", "cp", "--abi", f"cp{PYTHON_VERSION.replace('.', '')}",
    ]  # fmt: skip
    if index_url:
        cmd += ["--index-url", index_url]
    return [*cmd, "--", *packages]


def prepare_context(step: ImageStep, index_url: str | None = None) -> Path:
    """A build context for ``step``: its Dockerfile and site-packages/ with the pip packages fetched.

    Raises:
        SandboxError: pip could not fetch a package; the message is pip's own (its last lines).
    """
    context = Path(tempfile.mkdtemp(prefix="sandfleet-custom-image-", dir="/var/tmp"))
    try:
        assert step.dockerfile is not None
        shutil.copy(step.dockerfile, context / "Dockerfile")
        site = context / SITE_PACKAGES
        site.mkdir()
        packages = step.build_args.get("PIP_PACKAGES", "").split()
        if packages:
            _fetch_wheels(packages, site, index_url)
            shutil.rmtree(site / "bin", ignore_errors=True)  # scripts whose #! names the host's python
        return context
    except BaseException:
        shutil.rmtree(context, ignore_errors=True)
        raise


def _fetch_wheels(packages: list[str], site: Path, index_url: str | None) -> None:
    try:
        proc = subprocess.run(
            pip_target_command(packages, site, index_url),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=PIP_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired as e:
        raise SandboxError(f"pip did not fetch {' '.join(packages)} within {PIP_TIMEOUT_S} s") from e
    if proc.returncode != 0:
        lines = [line for line in proc.stdout.splitlines() if not line.startswith("WARNING: Location")]
        tail = "\n".join(lines[-ERROR_TAIL_LINES:]).strip() or "no output"
        raise SandboxError(f"pip could not install {' '.join(packages)} (exit {proc.returncode}):\n{tail}")


def build_custom_image(step: ImageStep, index_url: str | None = None) -> None:
    """Fetch the wheels, then ``docker build`` the image (a build_images builder). Raises SandboxError
    with pip's or Docker's last lines; a failed build tags nothing."""
    context = prepare_context(step, index_url)
    try:
        run_command(build_context_command(step, context), env={"DOCKER_BUILDKIT": "0"})
    finally:
        shutil.rmtree(context, ignore_errors=True)


def build_context_command(step: ImageStep, context: Path) -> list[str]:
    """``docker build`` of a custom image from its prepared context, with its labels."""
    args = [arg for key, value in step.build_args.items() for arg in ("--build-arg", f"{key}={value}")]
    packages = "; ".join(
        f"{kind}: {step.build_args[key]}" for kind, key in (("pip", "PIP_PACKAGES"), ("apt", "APT_PACKAGES"))
        if step.build_args.get(key)
    )  # fmt: skip
    return [
        "docker", "build", "--force-rm", *args,
        "--label", f"sandfleet.recipe={step.recipe}",
        "--label", f"{LABEL_CUSTOM}={step.name.removeprefix('custom-')}",
        "--label", f"{LABEL_PACKAGES}={packages}",
        "-t", step.tag, str(context),
    ]  # fmt: skip
