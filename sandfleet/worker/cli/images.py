"""``sandfleet images build``: the sandbox images, made with no container registry (see sandfleet.worker.images.build)."""

from __future__ import annotations

import functools
from pathlib import Path

import click

from sandfleet.core.console import echo, echo_json
from sandfleet.core.errors import SandfleetError
from sandfleet.core.sizes import format_size
from sandfleet.worker.images import build as recipes
from sandfleet.worker.images import custom as custom_images


@click.group()
def images() -> None:
    """Sandbox images: build them from the distribution's packages."""


@images.command()
@click.option(
    "--data-science", is_flag=True, help=f"Also build {recipes.DATA_SCIENCE_TAG} (numpy, pandas, matplotlib)."
)
@click.option(
    "--if-changed", is_flag=True, help="Skip images whose recipe label matches (seconds when ready)."
)
@click.option(
    "--base",
    type=click.Choice(recipes.BASES),
    default="debian",
    show_default=True,
    help="debian: debootstrap + docker import, no registry. python-slim: FROM python:3.11-slim (registry).",
)
@click.option(
    "--mirror",
    envvar="SANDFLEET_DEBIAN_MIRROR",
    metavar="URL",
    help="Debian mirror for debootstrap [env SANDFLEET_DEBIAN_MIRROR; default: apt's, else deb.debian.org].",
)
@click.option(
    "--rootfs",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="Import this existing debootstrap tree instead of making one (air-gapped sites, development).",
)
@click.option(
    "--json", "as_json", is_flag=True, help="Print a JSON list of {name, tag, status, seconds, size...}."
)
@click.option(
    "--name",
    default=None,
    help="Build a custom image sandfleet/custom-NAME:py3.11: the sandbox image plus --pip/--apt packages.",
)
@click.option(
    "--pip", "pip_packages", multiple=True, metavar="PKG", help="A package from the index (repeat)."
)
@click.option("--apt", "apt_packages", multiple=True, metavar="PKG", help="A Debian package (repeat).")
@click.option(
    "--index-url", default=None, metavar="URL", help="The package index for --pip (default: pip's own)."
)
def build(
    data_science: bool,
    if_changed: bool,
    base: str,
    mirror: str | None,
    rootfs: Path | None,
    as_json: bool,
    name: str | None,
    pip_packages: tuple[str, ...],
    apt_packages: tuple[str, ...],
    index_url: str | None,
) -> None:
    """Build sandfleet/base:bookworm, sandfleet/sandbox:py3.11 and (--data-science) sandbox-ds; or,
    with --name, a custom image on top of the sandbox image with the packages named.

    Prints each image's build time and size. A custom image whose recipe is unchanged is skipped.
    """
    if (pip_packages or apt_packages) and name is None:
        raise click.UsageError("--pip and --apt build a custom image: give it a --name")
    params = recipes.DebootstrapParams(
        mirror=(mirror or recipes.default_mirror()).rstrip("/"), keyring=recipes.default_keyring()
    )
    progress = (lambda _msg: None) if as_json else (lambda msg: echo(f"[images] {msg}", err=True))
    builders = {}
    try:
        if name is not None:
            if base != "debian" or data_science:
                raise click.UsageError(
                    "--name builds on the debootstrapped sandbox image: no --base or --data-science"
                )
            steps = custom_images.plan_custom_image(name, pip_packages, apt_packages)
            builders[steps[-1].name] = functools.partial(
                custom_images.build_custom_image, index_url=index_url
            )
            if_changed = True  # the same recipe is never rebuilt; nor are its parents
        else:
            steps = recipes.plan_images(base, data_science, params)
        results = recipes.build_images(
            steps, if_changed=if_changed, params=params, rootfs=rootfs, progress=progress, builders=builders
        )
    except SandfleetError as e:
        raise click.ClickException(str(e)) from e
    if name is not None and not as_json:
        echo(
            f"jobs may use {results[-1].tag} once the operator's policy allows it, e.g. "
            f"SANDFLEET_POLICY_IMAGES=...,{results[-1].tag} (or {custom_images.CUSTOM_PREFIX}*:py3.11)",
            err=True,
        )
    if as_json:
        echo_json([r.as_dict() for r in results], indent=2)
        return
    width = max([30, *(len(r.tag) for r in results)])
    echo(f"{'IMAGE':<{width}} {'STATUS':<20} {'TIME':>8} {'SIZE':>8}")
    for r in results:
        status = "unchanged, skipped" if r.status == recipes.BuildStatus.SKIPPED else "built"
        took = "-" if r.status == recipes.BuildStatus.SKIPPED else f"{r.seconds:.1f} s"
        echo(f"{r.tag:<{width}} {status:<20} {took:>8} {format_size(r.size_bytes, rounded=True):>8}")
