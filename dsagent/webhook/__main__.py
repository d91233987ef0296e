"""``python -m dsagent.webhook``: serve the admission webhook with settings from ``DSAGENT_WEBHOOK_*``."""

from dsagent.webhook.server import main

main()
