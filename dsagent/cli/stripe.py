"""``dsctl stripe hold / wait / release``: a node's part in a striped version (docs/design-striping.md).

Who calls it: an operator (or the controller's task, later) asks a node to hold its share
with ``hold`` and drops it with ``release``; a pod's init container runs ``wait`` to report the share's progress and to
return once enough of it is local (``--until ready-enough``, the default: the reader fetches
the rest through the agent) or all of it (``--until complete``). Everything goes through
:class:`dsagent.api.client.AgentClient`; errors surface as one line and their exit code.
"""

from __future__ import annotations

import json
import time

import click

from dsagent.cli.cache import POLL_SECONDS, _client, agent_options
from dsagent.cli.options import DURATION, output_option
from dsagent.errors import DsagentError, InvalidInput, NotFound, TransientError
from dsplatform.units import format_size
from dsplatform.wire.stripehold import stripe_request


@click.group()
def stripe() -> None:
    """Hold and follow this node's share of a striped version."""


@stripe.command()
@click.argument("name")
@click.option("--store", required=True, help="The bundle store holding the packed version.")
@click.option("--member", "members", multiple=True, required=True, help="A node of the stripe group (repeat).")
@click.option("--peer", "peers", multiple=True, metavar="NODE=URL", help="A member's agent base URL (repeat).")
@click.option(
    "--no-share", "no_share", multiple=True, metavar="NODE",
    help="A member that owns no bundle: it reads through its window (repeat).",
)  # fmt: skip
@click.option("--digest", help="The version (default: the store's current one).")
@click.option("--ready-after", type=click.IntRange(min=0), default=1, show_default=True)
@click.option(
    "--whole", is_flag=True,
    help="Hold every bundle (this node's own first) where the version fits this node; else the share.",
)  # fmt: skip
@click.option(
    "--store-on-demand", is_flag=True,
    help="Fill from the peers only; read the store only for bundles a reader waits for (with --ready-after 0).",
)  # fmt: skip
@click.option("--lease", type=DURATION, default=None, help="Dropped unless held again within this long.")
@output_option
@agent_options
def hold(
    name: str,
    store: str,
    members: tuple[str, ...],
    peers: tuple[str, ...],
    no_share: tuple[str, ...],
    digest: str | None,
    ready_after: int,
    whole: bool,
    store_on_demand: bool,
    lease: float | None,
    output: str,
    agent_url: str | None,
    socket_path: str | None,
    token: str | None,
) -> None:
    """Ask this node's agent to hold its share of NAME (operators only)."""
    urls: dict[str, str] = {}
    for spec in peers:
        node, sep, url = spec.partition("=")
        if not sep or not node or not url:
            raise InvalidInput(f"--peer {spec!r} is not NODE=URL")
        urls[node] = url
    body = stripe_request(
        store, members, urls, digest=digest, no_share=no_share, ready_after=ready_after, whole=whole,
        store_on_demand=store_on_demand, lease_seconds=lease,
    )  # fmt: skip
    with _client(agent_url, socket_path, token) as client:
        answer = client.hold_stripe(name, body)
    if output == "json":
        click.echo(json.dumps(answer, indent=2))
        return
    held = ", ".join(f"{k} {v}" for k, v in answer.items() if isinstance(v, (str, int, float, bool)))
    click.echo(f"holding the share of {name}: {held}")


@stripe.command()
@click.argument("name")
@click.argument("digest")
@click.option("--until", type=click.Choice(["ready-enough", "complete"]), default="ready-enough", show_default=True)
@click.option("--timeout", type=DURATION, default=None, help="Give up after this long (exit 7).")
@output_option
@agent_options
def wait(
    name: str,
    digest: str,
    until: str,
    timeout: float | None,
    output: str,
    agent_url: str | None,
    socket_path: str | None,
    token: str | None,
) -> None:
    """Report the share's progress until enough of it (or all of it) is held here. While
    this node holds no share of the version yet (the Dataset's controller holds it on the
    group's members), it waits for one, saying so. A version another one replaced in the
    store since the pod was admitted is never held again: that stops the wait at once
    (exit 15)."""
    key = "readyEnough" if until == "ready-enough" else "complete"
    deadline = None if timeout is None else time.monotonic() + timeout
    shown = None
    with _client(agent_url, socket_path, token) as client:
        while True:
            try:
                status = client.stripe_status(name, digest)
            except NotFound:
                status = {key: False, "error": None}
                line = f"{name}@{digest[:12]}: this node holds no share of it yet"
            else:
                line = (
                    f"{name}@{digest[:12]}: {status['bundlesHeld']} of {status['bundlesOwned']} bundles held"
                    f" ({format_size(status['bytesHeld'])} of {format_size(status['bytesOwned'])})"
                )
            if line != shown and output == "text":
                click.echo(line)
                shown = line
            if status.get("error"):
                raise DsagentError(f"the share of {name} stopped: {status['error']}")
            if status[key]:
                if output == "json":
                    click.echo(json.dumps(status, indent=2))
                return
            if deadline is not None and time.monotonic() >= deadline:
                raise TransientError(f"the share of {name} is not {until} after {timeout:g}s: {line}")
            time.sleep(POLL_SECONDS)


@stripe.command()
@click.argument("name")
@click.option("--digest", help="Only this version (default: every version of NAME held here).")
@output_option
@agent_options
def release(
    name: str, digest: str | None, output: str, agent_url: str | None, socket_path: str | None, token: str | None
) -> None:
    """Drop this node's share of NAME now (operators only; exit 3 when none is held)."""
    with _client(agent_url, socket_path, token) as client:
        answer = client.release_stripe(name, digest)
    if output == "json":
        click.echo(json.dumps(answer, indent=2))
        return
    click.echo(f"released the share of {name}: " + ", ".join(d[:12] for d in answer.get("released", [])))
