"""``dsctl gc STORE``: list, and with ``--delete`` remove, bundles no manifest references.

Who calls it: operators and scheduled jobs cleaning a bundle store after re-packs (re-packing
with other caps can leave nearly every old bundle orphaned). The policy and the I/O are
:mod:`dsagent.format.bundles.bundlegc`'s; this module parses options and prints. A dry run by default:
one line per orphan and a summary; ``-o json`` for machines.
"""

from __future__ import annotations

import json
from typing import Any

import click

from dsagent.cli.bundlework import options_for_stores
from dsagent.cli.options import output_option, store_options
from dsagent.errors import InvalidInput
from dsplatform.units import UnitError, format_size, parse_duration


@click.command()
@click.argument("store")
@click.option("--delete", is_flag=True, help="Delete the orphaned bundles older than --grace (default: only list).")
@click.option(
    "--grace",
    default="24h",
    show_default=True,
    metavar="DURATION",
    help="Never delete a bundle younger than this (a pack may be writing it), e.g. 6h, 7d.",
)
@store_options
@output_option
def gc(
    store: str,
    delete: bool,
    grace: str,
    store_opts: dict[str, Any],
    output: str,
) -> None:
    """List (or with --delete remove) the bundles in STORE that no manifest references."""
    from dsagent.format.bundles.bundlegc import collect

    try:
        grace_seconds = parse_duration(grace)
    except UnitError as exc:
        raise InvalidInput(f"--grace: {exc}", hint="e.g. --grace 24h") from exc
    options = options_for_stores(store_opts)
    plan = collect(store, options, grace_seconds=grace_seconds, delete=delete)
    if output == "json":
        data = {
            "store": store,
            "manifests": plan.manifests,
            "referenced": plan.referenced,
            "orphans": [b.digest for b in plan.delete],
            "young": [b.digest for b in plan.young],
            "reclaimableBytes": plan.reclaimable_bytes,
            "deleted": [b.digest for b in plan.deleted],
            "restored": list(plan.restored),
            "dryRun": not delete,
        }
        click.echo(json.dumps(data))
        return
    gone = {b.digest for b in plan.deleted}
    for bundle in plan.delete:
        verb = "deleted" if bundle.digest in gone else ("kept (referenced again)" if delete else "orphan")
        click.echo(f"{verb} {bundle.digest} {format_size(bundle.size)}")
    for bundle in plan.young:
        click.echo(f"young {bundle.digest} {format_size(bundle.size)} (inside --grace {grace}, kept)")
    summary = (
        f"{len(plan.delete)} orphaned bundles ({format_size(plan.reclaimable_bytes)}), {len(plan.young)} younger"
        f" than {grace}, {plan.referenced} referenced by {plan.manifests} manifests"
    )
    if delete:
        if plan.restored:  # a manifest came to reference them while they were set aside (docs/design.md#store-gc)
            click.echo(f"put back {len(plan.restored)} bundles a manifest references again: {' '.join(plan.restored)}")
        click.echo(f"{summary}; deleted {len(plan.deleted)}")
    else:
        click.echo(f"{summary}; dry run, nothing deleted (add --delete)")
