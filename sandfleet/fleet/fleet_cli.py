"""``sandfleet fleet down``: remove what multi-host fleets (sandfleet/fleet/hosts.py) left behind."""

from __future__ import annotations

import click

from sandfleet.core.console import echo


@click.group()
def fleet() -> None:
    """Local multi-host fleets (network namespaces, engines, workers)."""


@fleet.command()
@click.option("--all", "everything", is_flag=True, help="Also fleets whose owner process still runs.")
def down(everything: bool) -> None:
    """Remove the sfh- namespaces, engines, workers, cgroups and folders of fleets whose owner died."""
    from sandfleet.fleet.hosts import clean_leftovers

    removed = clean_leftovers(everything=everything)
    echo(f"removed {len(removed)} multi-host fleet(s)" + (f": runs {removed}" if removed else ""))
