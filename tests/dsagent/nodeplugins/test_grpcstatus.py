"""One gRPC rule for both kubelet plugins: an error answers with its own ``grpc_status``."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

grpc = pytest.importorskip("grpc")

from dsagent import errors  # noqa: E402
from dsagent.kube.apiclient import KubeForbidden, KubeUnavailable  # noqa: E402
from dsagent.nodeagent.clusterhooks import TaskNotOnNode  # noqa: E402
from dsagent.nodeplugins.csi.driver import NodeServicer  # noqa: E402
from dsagent.nodeplugins.deviceplugin.allocation import DeviceInUse, NoFreeVf  # noqa: E402
from dsagent.nodeplugins.deviceplugin.plugin import _Servicer  # noqa: E402
from dsagent.nodeplugins.grpcstatus import status_code  # noqa: E402
from dsagent.nodeplugins.proto import deviceplugin_v1beta1_pb2 as pb  # noqa: E402
from dsagent.nodeplugins.proto.csi import csi_pb2  # noqa: E402

CODES = grpc.StatusCode

# the CSI spec's codes where it names one; the device plugin's own conflicts are the node's state
EXPECTED = [
    (errors.InvalidInput("bad volume_id"), CODES.INVALID_ARGUMENT),
    (errors.SettingsError("bad DSAGENT_CSI_SOCKET"), CODES.INVALID_ARGUMENT),
    (errors.NotFound("no task"), CODES.NOT_FOUND),
    (errors.Conflict("volume v is already published at another target path"), CODES.ALREADY_EXISTS),
    (NoFreeVf("every VF of mlx5_0 is taken"), CODES.FAILED_PRECONDITION),
    (DeviceInUse("GPU-0 is held under gpu-roce1"), CODES.FAILED_PRECONDITION),
    (errors.InsufficientSpace("cannot free 10 GB"), CODES.RESOURCE_EXHAUSTED),
    (errors.TransientError("the agent is starting"), CODES.UNAVAILABLE),
    (KubeUnavailable("the API server is unreachable"), CODES.UNAVAILABLE),
    (TaskNotOnNode("pod abc is not on this node"), CODES.PERMISSION_DENIED),
    (errors.Forbidden("another pod's task"), CODES.PERMISSION_DENIED),
    (KubeForbidden("RBAC"), CODES.PERMISSION_DENIED),
    (errors.StorageCredentials("no credentials"), CODES.PERMISSION_DENIED),
    (errors.Unauthorized("no admin token"), CODES.UNAUTHENTICATED),
    (errors.IntegrityError("digest mismatch"), CODES.INTERNAL),
    (errors.DsagentError("still mounted"), CODES.INTERNAL),
]


@pytest.mark.parametrize(("error", "code"), EXPECTED, ids=lambda v: type(v).__name__)
def test_each_error_has_one_status(error: errors.DsagentError, code: Any) -> None:
    assert status_code(error) == code


class Aborted(Exception):
    pass


class Context:
    """The part of a grpc.aio servicer context the servicers use: abort, which raises."""

    def __init__(self) -> None:
        self.aborted: tuple[Any, str] | None = None

    async def abort(self, code: Any, details: str) -> None:
        self.aborted = (code, details)
        raise Aborted


class Failing:
    """A CSI driver and a device plugin at once whose work raises ``error``."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    async def publish(self, *args: Any, **kwargs: Any) -> None:
        raise self.error

    async def allocate(self, resource: str, container: Any) -> Any:
        raise self.error


def csi_answer(error: Exception) -> tuple[Any, str] | None:
    request = csi_pb2.NodePublishVolumeRequest(
        volume_id="v", target_path="/t", volume_capability=csi_pb2.VolumeCapability(mount={})
    )
    context = Context()
    with pytest.raises(Aborted):
        asyncio.run(NodeServicer(Failing(error)).NodePublishVolume(request, context))
    return context.aborted


def device_plugin_answer(error: Exception) -> tuple[Any, str] | None:
    request = pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=["GPU-0"])])
    context = Context()
    with pytest.raises(Aborted):
        asyncio.run(_Servicer(Failing(error), "dsagent.io/gpu-all").Allocate(request, context))
    return context.aborted


@pytest.mark.parametrize("answer", [csi_answer, device_plugin_answer])
@pytest.mark.parametrize(("error", "code"), EXPECTED, ids=lambda v: type(v).__name__)
def test_both_plugins_answer_with_the_errors_own_status_and_line(answer: Any, error: Exception, code: Any) -> None:
    assert answer(error) == (code, str(error))
