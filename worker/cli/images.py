"""``sandfleet images build``: the sandbox images, made with no container registry (see sandfleet.worker.images)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from sandfleet.core.errors import SandfleetError
from sandfleet.worker import images as recipes


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
def build(
    data_science: bool, if_changed: bool, base: str, mirror: str | None, rootfs: Path | None, as_json: bool
) -> None:
    """Build sandfleet/base:bookworm, sandfleet/sandbox:py3.11 and (--data-science) sandbox-ds.

    Prints each image's build time and size.
    """
    params = recipes.DebootstrapParams(
        mirror=(mirror or recipes.default_mirror()).rstrip("/"), keyring=recipes.default_keyring()
    )
    progress = (lambda _msg: None) if as_json else (lambda msg: click.echo(f"[images] {msg}", err=True))
    try:
        steps = recipes.plan_images(base, data_science, params)
        results = recipes.build_images(
            steps, if_changed=if_changed, params=params, rootfs=rootfs, progress=progress
        )
    except SandfleetError as e:
        raise click.ClickException(str(e)) from e
    if as_json:
        click.echo(json.dumps([r.as_dict() for r in results], indent=2))
        return
    click.echo(f"{'IMAGE':<30} {'STATUS':<20} {'TIME':>8} {'SIZE':>8}")
    for r in results:
        status = "unchanged, skipped" if r.status == recipes.BuildStatus.SKIPPED else "built"
        took = "-" if r.status == recipes.BuildStatus.SKIPPED else f"{r.seconds:.1f} s"
        click.echo(f"{r.tag:<30} {status:<20} {took:>8} {recipes.format_size(r.size_bytes):>8}")
