"""``dsagent webhook serve``: the admission webhook's command (same as ``python -m dsagent.webhook``).

Settings come from ``DSAGENT_WEBHOOK_*`` (see :mod:`dsagent.webhook.server`); the chart's
webhook Deployment runs ``python -m dsagent.webhook``, which needs no registration.
"""

from __future__ import annotations

import click


@click.group()
def webhook() -> None:
    """The dsplatform mutating admission webhook."""


@webhook.command()
def serve() -> None:
    """Serve AdmissionReviews over HTTPS until interrupted (settings: DSAGENT_WEBHOOK_*)."""
    from dsagent.webhook.server import main

    main()
