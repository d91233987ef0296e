"""The kubelet plugins' one rule for answering an error over gRPC: the error's own status.

Every deliberate error carries ``grpc_status`` (:mod:`dsplatform.errors`; the name of a
``grpc.StatusCode`` member). The CSI node plugin and the device plugin both answer with it,
so a class means the same code on either socket. The codes follow the CSI spec where it names
one (an incompatible re-publish ``ALREADY_EXISTS``, a pod not on this node
``PERMISSION_DENIED``, a full disk ``RESOURCE_EXHAUSTED``, an agent not ready ``UNAVAILABLE``);
the device-plugin API names none, and its own conflicts (no free VF, a GPU held under another
resource) are the node's state, ``FAILED_PRECONDITION``.
"""

from __future__ import annotations

from typing import Any

import grpc

from dsplatform.errors import PlatformError


def status_code(error: PlatformError) -> grpc.StatusCode:
    """The gRPC status ``error`` answers with."""
    return grpc.StatusCode[error.grpc_status]


async def abort(context: grpc.aio.ServicerContext[Any, Any], error: PlatformError) -> None:
    """End the call with ``error``'s status and its one line (hint included)."""
    await context.abort(status_code(error), str(error))


__all__ = ["abort", "status_code"]
