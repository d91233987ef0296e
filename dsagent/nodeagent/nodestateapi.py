"""The node agent's API writes of what it publishes about its node: its Node's annotations and
its ``NodeCache`` (docs/design.md#node-state).

Who calls it: :class:`dsagent.nodeagent.clusteragent.ClusterAgent`, from threads (each call
is one blocking request to the API server, bounded by its timeout); how often it writes is
:mod:`dsagent.nodeagent.statewrites`' rule, what it writes :mod:`dsagent.nodeagent.publisher`'s
and the object's shape :mod:`dsplatform.wire.nodecache`'s.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

from dsagent.errors import NotFound
from dsagent.kube.apiclient import translated
from dsagent.kube.datasets import MERGE_PATCH
from dsplatform.kubetime import format_time
from dsplatform.wire import nodecache


class NodeStateApi:
    """One node's published state on the API server, through the client's typed APIs."""

    def __init__(self, core: Any, custom: Any, node_name: str) -> None:
        self.core, self.custom, self.node_name = core, custom, node_name
        self.node_uid: str | None = None  # the NodeCache's owner, once the Node was read

    def read_annotations(self) -> dict[str, str]:
        """The Node's annotations (and its uid, the ``NodeCache``'s owner)."""
        with translated(f"read node {self.node_name}"):
            node = self.core.read_node(self.node_name, _request_timeout=10)
        if node.metadata is not None and node.metadata.uid:
            self.node_uid = str(node.metadata.uid)
        return dict((node.metadata.annotations if node.metadata else None) or {})

    def write_nodecache(self, status: Mapping[str, Any], before: Mapping[str, Any] | None, timeout: float = 10) -> int:
        """Merge-patch the node's ``NodeCache`` from ``before`` (its status as last written) to
        ``status``, creating it (owned by the Node) when it is missing; the bytes of the
        request body."""
        group, version, plural = nodecache.GROUP, nodecache.API_VERSION, nodecache.PLURAL
        body = nodecache.merge_patch(status, before)
        try:
            with translated(f"patch nodecache {self.node_name}"):
                self.custom.patch_cluster_custom_object(
                    group, version, plural, self.node_name, body, _content_type=MERGE_PATCH, _request_timeout=timeout
                )
            return len(json.dumps(body))
        except NotFound:
            pass
        document = nodecache.document(self.node_name, self.node_uid, status)
        with translated(f"create nodecache {self.node_name}"):
            self.custom.create_cluster_custom_object(group, version, plural, document, _request_timeout=timeout)
        return len(json.dumps(document))

    def clear_nodecache(self, timeout: float) -> None:
        """Empty the ``NodeCache`` (a blind merge patch: none to empty is fine)."""
        body = {"status": {"inventory": None, "topology": None, "publishedAt": format_time(time.time())}}
        try:
            with translated(f"patch nodecache {self.node_name}"):
                self.custom.patch_cluster_custom_object(
                    nodecache.GROUP, nodecache.API_VERSION, nodecache.PLURAL, self.node_name, body,
                    _content_type=MERGE_PATCH, _request_timeout=timeout,
                )  # fmt: skip
        except NotFound:
            return

    def patch_annotations(self, patch: Mapping[str, str | None], timeout: float = 10) -> None:
        """Merge-patch the Node's annotations (None removes one)."""
        with translated(f"patch node {self.node_name}"):
            self.core.patch_node(
                self.node_name, {"metadata": {"annotations": dict(patch)}},
                _content_type=MERGE_PATCH, _request_timeout=timeout,
            )  # fmt: skip


__all__ = ["NodeStateApi"]
