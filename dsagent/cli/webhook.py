"""``dsagent webhook serve``: the admission webhook's command (same as ``python -m dsagent.cluster.admission.server``).

Settings come from ``DSAGENT_WEBHOOK_*`` (see :mod:`dsagent.cluster.admission.server`); the chart's
webhook Deployment runs ``python -m dsagent.cluster.admission.server``, which needs no registration.
"""

from __future__ import annotations

import click


@click.group()
def webhook() -> None:
    """The dsplatform mutating admission webhook."""


@webhook.command()
def serve() -> None:
    """Serve AdmissionReviews over HTTPS until interrupted (settings: DSAGENT_WEBHOOK_*)."""
    from dsagent.cluster.admission.server import main

    main()
