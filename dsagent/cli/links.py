"""``python -m dsagent.cli.links LINK_DIR DATASETS_MOUNT``: the cache container's last step.

Who calls it: the cache container (init-container or sidecar) that the webhook injects
(:mod:`dsagent.webhook.mutation`). It asks the local agent for the pod's task over its socket
(``DSAGENT_TASK_ID``, ``DSAGENT_SOCKET``) and writes the stable links that
:mod:`dsagent.kube.stablelinks` computes. Exit codes are the error tree's.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from dsagent.api.client import AgentClient
from dsagent.cli.options import default_socket
from dsagent.errors import DsagentError, InvalidInput
from dsagent.kube.stablelinks import link_targets, write_links
from dsplatform.errors import exit_on_error


def main(argv: list[str] | None = None) -> None:
    """The command; a failure is one line and the error tree's exit code (the process edge)."""
    with exit_on_error("dsagent links"):
        _links(sys.argv[1:] if argv is None else argv)


def _links(args: list[str]) -> None:
    if len(args) != 2:
        raise InvalidInput("usage: python -m dsagent.cli.links LINK_DIR DATASETS_MOUNT")
    task_id = os.environ.get("DSAGENT_TASK_ID")
    try:
        if not task_id:
            raise InvalidInput("DSAGENT_TASK_ID is not set")
        with AgentClient(socket_path=default_socket(os.environ), timeout=30) as client:
            record = client.get_task(task_id)
        targets = link_targets(record, args[1])
        missing = sorted(name for name, target in targets.items() if not os.path.isdir(target))
        if missing:
            raise InvalidInput(
                f"cached datasets {missing} are not visible under {args[1]}",
                hint="the cache container must mount the node's datasets there",
            )
        write_links(Path(args[0]), targets)
    except OSError as exc:
        raise DsagentError(f"cannot write links in {args[0]}: {exc.strerror}") from exc


if __name__ == "__main__":
    main()
