"""``python -m dsagent.controller``: run the Dataset controller with settings from ``DSAGENT_CONTROLLER_*``."""

from dsagent.controller.process import main

main()
