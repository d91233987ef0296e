"""``dsagent webhook serve``: the admission webhook's command (same as ``python -m dsagent.kube.webhook``).

Settings come from ``DSAGENT_WEBHOOK_*`` (see :mod:`dsagent.kube.webhook`); the chart's
webhook Deployment runs ``python -m dsagent.kube.webhook``, which needs no registration.
"""

from __future__ import annotations

import click


@click.group()
def webhook() -> None:
    """The dsplatform mutating admission webhook."""


@webhook.command()
def serve() -> None:
    """Serve AdmissionReviews over HTTPS until interrupted (settings: DSAGENT_WEBHOOK_*)."""
    from dsagent.kube.webhook import main

    main()
