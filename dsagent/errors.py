"""The one error tree of the dsagent package.

Every error the agent or ``dsctl`` raises on purpose derives from :class:`DsagentError`, a
:class:`dsplatform.errors.PlatformError`: each class carries its machine-readable ``code``, the
HTTP status the API answers with, the exit code ``dsctl`` exits with and the gRPC status the
CSI node plugin and the device plugin answer with. Exactly two kinds of edge translate them:
the API's exception handler, and the process edge :func:`dsplatform.errors.exit_on_error`
that ``dsctl``, ``dsagent``, the webhook and the controller run under (the kubelet plugins'
one gRPC helper, :mod:`dsagent.nodeplugins.grpcstatus`, reads ``grpc_status``). Domain code
never raises framework exceptions or exits, and foreign exceptions (``OSError`` from fsspec,
``sqlite3.Error``, ``zstd`` errors) are translated where they enter, with ``raise ... from exc``;
so is ``format.durable.WritebackError``, an ``OSError`` on purpose (the kernel's errno from a
failed flush). Classes defined beside their code are drawn with their module.

    DsagentError (500, exit 1, INTERNAL)
    ├── InvalidInput (400, exit 2, INVALID_ARGUMENT)  bad names, URLs, sizes, settings, flags
    │   ├── SettingsError                     a DSAGENT_* value or flag is invalid
    │   │   └── KubernetesUnavailable         cli.nodeparts: cluster mode is not in this build
    │   └── BodyTooLarge (413)                api: a request body over its limit
    ├── Unauthorized (401, exit 9, UNAUTHENTICATED)   operator action without a valid admin token
    ├── StorageCredentials (403, exit 11, PERMISSION_DENIED)  the dataset source or bundle store
    │                                         has no, or refused, credentials
    ├── StorageForbidden (403, exit 12, PERMISSION_DENIED)  the store knows the credentials but
    │                                         refuses the action
    ├── Forbidden (403, exit 9, PERMISSION_DENIED)  a pod acting on another pod's task, or evicting
    │   ├── KubeForbidden                     kube.apiclient: the API server refused the service account
    │   └── NamespaceShareExceeded            a namespace's pins would pass its share of the node's cache
    ├── TaskNotOnNode (403, exit 2, PERMISSION_DENIED)  nodeagent.clusterhooks: a pod-UID task id that
    │                                         is no pod on this node
    ├── NotFound (404, exit 3, NOT_FOUND)     unknown dataset, task, manifest or bundle
    │   └── BundleMissing                     --bundles store has no manifest for the dataset
    ├── Conflict (409, exit 4, ALREADY_EXISTS)  dataset in use, task already holds another set,
    │   │                                     a CSI volume re-published incompatibly
    │   ├── NoFreeVf (FAILED_PRECONDITION)    nodeplugins.deviceplugin.allocation: every VF taken
    │   └── DeviceInUse (FAILED_PRECONDITION) nodeplugins.deviceplugin.allocation: a GPU held elsewhere
    ├── IntegrityError (422, exit 5)          digest mismatch, truncated or tampered bundle
    │   └── UnsafeArchive                     a member that would escape its target
    ├── InsufficientSpace (507, exit 6, RESOURCE_EXHAUSTED)  cannot free enough space (gives the numbers)
    ├── CacheDiskError (507, exit 13, INTERNAL)  the cache disk itself failed a write (EIO, EROFS, ...)
    ├── CatalogError                          cache.catalog: the catalog cannot be written
    │   └── CatalogDamaged                    cache.catalog: not a readable SQLite file (rebuilt)
    ├── MountError                            nodeplugins.csi.mounts: a mount or unmount failed
    ├── VfSetupFailed (FAILED_PRECONDITION)   nodeplugins.deviceplugin.vfsetup: the kernel refused a
    │                                         VF's count, address or link state
    ├── StillRunning (202, exit 14)           dsctl stopped waiting (--timeout) for an action the
    │                                         agent goes on with: not a failure, nothing to retry
    ├── Superseded (410, exit 15, NOT_FOUND)  a striped version another one replaced in the store:
    │                                         never held again (also a dsplatform.errors.Superseded)
    └── TransientError (503, exit 7, UNAVAILABLE)  worth retrying: source or agent unreachable
        ├── SourceUnavailable                 the dataset source or bundle store failed
        │   └── RangesUnsupported             cache.fetchranges: no byte ranges from the store
        │                                     (the bundle is then read in one stream)
        ├── AgentUnreachable (exit 8)         dsctl could not reach the local agent
        ├── AgentStopping                     the agent is stopping: it takes no new task
        ├── FetchStopped                      a stripe share's fetch, its share let go or
        │                                     no reader waiting for a window bundle
        ├── ClientGone                        api.clientgone: the client closed its connection
        │                                     before its answer was ready (nobody reads it)
        ├── KubeUnavailable                   kube.apiclient: the API server failed or is unreachable
        ├── PodResourcesUnavailable           nodeplugins.deviceplugin.podresources: the kubelet's
        │                                     pod-resources socket did not answer
        ├── PeerBusy (429), BundleInFlight (425), PeerOverloaded, PeerRefused
        │   └── PeerFetchingIt                cache.peers: a peer agent cannot serve the bundle now
        └── ReaderBusy (429)                  cache.striped.readerstreams: a caller's bundle streams
                                              already hold its share of the node's

"Transient vs permanent" is a type: retry only :class:`TransientError`.

Storage refusals answer 403, not 401: a 401 from the agent means the *caller* lacks the
agent's admin token (:class:`Unauthorized`); a 403 says the agent reached the store and the
store refused the agent. The exit codes are listed in the documentation's exit codes reference,
which ``tests/test_exit_codes.py`` checks against these classes; ``tests/test_errors.py``
checks that every public error class of the packages is drawn in its tree.
"""

from __future__ import annotations

import errno

from dsplatform import errors as platform


class DsagentError(platform.PlatformError):
    """Base of every deliberate dsagent error (500, exit 1, INTERNAL: the base's facts)."""


class InvalidInput(platform.InvalidInput, DsagentError):
    """Bad input: a name, URL, size, setting or flag (400, exit 2, INVALID_ARGUMENT)."""


class SettingsError(InvalidInput):
    code = "invalid_setting"


class Unauthorized(DsagentError):
    http_status = 401
    exit_code = 9
    code = "unauthorized"
    grpc_status = "UNAUTHENTICATED"


class StorageCredentials(DsagentError):
    http_status = 403
    exit_code = 11
    code = "credentials"
    grpc_status = "PERMISSION_DENIED"


class StorageForbidden(DsagentError):
    http_status = 403
    exit_code = 12
    code = "storage_forbidden"
    grpc_status = "PERMISSION_DENIED"


class Forbidden(DsagentError):
    http_status = 403
    exit_code = 9
    code = "forbidden"
    grpc_status = "PERMISSION_DENIED"


class NotFound(DsagentError):
    http_status = 404
    exit_code = 3
    code = "not_found"
    grpc_status = "NOT_FOUND"


class NamespaceShareExceeded(Forbidden):
    """A pin for a namespace that already holds its share of this node's cache (docs/operator-guide/tenancy.md)."""

    code = "namespace_share"


class Conflict(DsagentError):
    # the CSI spec's code for a volume published again incompatibly (NodePublishVolume)
    http_status = 409
    exit_code = 4
    code = "conflict"
    grpc_status = "ALREADY_EXISTS"


class IntegrityError(DsagentError):
    http_status = 422
    exit_code = 5
    code = "integrity"


class UnsafeArchive(IntegrityError):
    code = "unsafe_archive"


class InsufficientSpace(DsagentError):
    http_status = 507
    exit_code = 6
    code = "insufficient_space"
    grpc_status = "RESOURCE_EXHAUSTED"


class CacheDiskError(DsagentError):
    """The node's cache disk failed an operation (EIO, EROFS, ...; a full one is
    :class:`InsufficientSpace`): the node's fault, not the source's, and not worth a retry
    until someone looks at the disk (it surfaced as ``source_unavailable``)."""

    http_status = 507  # "unable to store the representation" (RFC 4918), as for a full disk
    exit_code = 13
    code = "cache_disk"
    grpc_status = "INTERNAL"


class StillRunning(DsagentError):
    """``dsctl`` stopped waiting (its ``--timeout``) for an action that the agent accepted and
    goes on carrying out, an eviction or a release (:mod:`dsagent.api.operations`): not a
    failure and nothing to retry; the operation can still be followed."""

    http_status = 202  # never answered by the agent as an error: the client's own conclusion
    exit_code = 14
    code = "still_running"


class Superseded(platform.Superseded, DsagentError):
    """The striped version asked for is gone for good: the store holds another version of
    the name (it keeps one), and nothing here holds the one asked for. A pod pinned to it at
    admission must be created again to read the current version (docs/design-striping.md#superseded)."""


#: the errnos of a full disk or quota: never the source's or the store's health, never "retry"
FULL_DISK = frozenset({errno.ENOSPC, errno.EDQUOT})


def is_full_disk(exc: BaseException) -> bool:
    """Whether ``exc`` is an OS error of a full disk or quota (:data:`FULL_DISK`), named or not."""
    return isinstance(exc, OSError) and exc.errno in FULL_DISK


def local_write_error(exc: OSError, what: str) -> DsagentError:
    """The error for ``exc``, raised by the cache disk while doing ``what``: a full disk or
    quota is :class:`InsufficientSpace`, anything else :class:`CacheDiskError`."""
    if is_full_disk(exc):
        return InsufficientSpace(
            f"{what}: no space left on the cache disk ({exc})", hint="free space or evict unused datasets"
        )
    return CacheDiskError(f"{what}: the cache disk failed ({exc})", hint="check the cache disk (dmesg, mount options)")


class TransientError(platform.Unavailable, DsagentError):
    """Worth retrying: the source, the store or the agent failed or is unreachable (503, exit 7)."""


class SourceUnavailable(TransientError):
    code = "source_unavailable"


class AgentUnreachable(TransientError):
    exit_code = 8
    code = "agent_unreachable"


class FetchStopped(TransientError):
    """A fetch stopped because what it fetched for was let go (a stripe share released,
    dropped or re-planned): nothing of it was kept; a reader that waited for it asks again."""


class AgentStopping(TransientError):
    """The agent was told to stop and is handing its stripe shares to their new owners
    (docs/design-striping.md#churn): it takes no new task; ask the agent that replaces it."""

    code = "agent_stopping"


__all__ = [
    "FULL_DISK",
    "AgentStopping",
    "AgentUnreachable",
    "CacheDiskError",
    "Conflict",
    "DsagentError",
    "FetchStopped",
    "Forbidden",
    "InsufficientSpace",
    "IntegrityError",
    "InvalidInput",
    "NamespaceShareExceeded",
    "NotFound",
    "SettingsError",
    "SourceUnavailable",
    "StorageCredentials",
    "StorageForbidden",
    "Superseded",
    "TransientError",
    "UnsafeArchive",
    "Unauthorized",
    "is_full_disk",
    "local_write_error",
]


class BundleMissing(NotFound):
    """The bundle store a request names has no manifest for the dataset (the store itself
    answered: an unreachable store stays :class:`SourceUnavailable`). Refused unless the
    request allows the per-file path (``allowPerFile`` / ``dsctl cache --allow-per-file``)."""

    code = "bundle_missing"


__all__ += ["BundleMissing"]
