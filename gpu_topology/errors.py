"""The one error tree of the gpu_topology package.

Every error this library raises on purpose derives from :class:`TopologyError`, a
:class:`dsplatform.errors.PlatformError` (the platform's one base; ``dsplatform`` is the only
part of the platform this library imports): each class carries the HTTP status an API would
answer with, the exit code ``dsctl`` exits with, the gRPC status and a short machine-readable
``code``; the library itself never exits or answers HTTP. Foreign errors (``subprocess``,
``OSError``, XML and NVML errors) are translated where they enter, with ``raise ... from exc``.

    TopologyError (500, exit 1, INTERNAL)
    ├── InvalidTopology (400, exit 2, INVALID_ARGUMENT)  a topology or request that makes no sense
    │   ├── ParseError                       text/XML/JSON that cannot be read (says where)
    │   └── UnknownDevice                    a GPU index or NIC name the topology lacks
    └── DiscoveryError (503, exit 7, UNAVAILABLE)  discovering the local machine failed
        └── BackendUnavailable (exit 10)     a backend cannot run here (says what to install)
"""

from __future__ import annotations

from dsplatform import errors as platform


class TopologyError(platform.PlatformError):
    """Base of every deliberate gpu_topology error."""

    code = "topology_error"


class InvalidTopology(platform.InvalidInput, TopologyError):
    code = "invalid_topology"


class ParseError(InvalidTopology):
    code = "topology_parse_error"


class UnknownDevice(InvalidTopology):
    code = "unknown_device"


class DiscoveryError(platform.Unavailable, TopologyError):
    code = "discovery_failed"


class BackendUnavailable(DiscoveryError):
    exit_code = 10
    code = "backend_unavailable"
