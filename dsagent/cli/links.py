"""``python -m dsagent.cli.links LINK_DIR DATASETS_MOUNT``: the cache container's last step.

Who calls it: the cache container (init-container or sidecar) that the webhook injects
(:mod:`dsagent.cluster.admission.mutation`). It asks the local agent for the pod's task over its socket
(``DSAGENT_TASK_ID``, ``DSAGENT_SOCKET``) and writes the stable links that
:mod:`dsagent.cluster.stablelinks` computes. Exit codes are the error tree's.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from dsagent.api.client import AgentClient
from dsagent.cli.options import default_socket
from dsagent.cluster.stablelinks import link_targets, write_links
from dsagent.errors import DsagentError, InvalidInput


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m dsagent.cli.links LINK_DIR DATASETS_MOUNT", file=sys.stderr)
        return 2
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
    except DsagentError as exc:
        print(f"dsagent links: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except OSError as exc:
        print(f"dsagent links: error: cannot write links in {args[0]}: {exc.strerror}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
