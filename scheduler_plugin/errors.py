"""The one error tree of the scheduler_plugin package.

Every error the extender raises on purpose derives from :class:`SchedulerPluginError`, a
:class:`dsplatform.errors.PlatformError` (the platform's one base; ``dsagent.errors``, which
this package must not import, derives from it too): each class carries the HTTP status, the
exit code, the gRPC status and a short machine-readable ``code``. The two edges are the HTTP
app (which, for kube-scheduler's verbs, never answers with an error status: see
:mod:`scheduler_plugin.app`) and the process edge :func:`dsplatform.errors.exit_on_error`
that ``python -m scheduler_plugin`` runs under.

    SchedulerPluginError (500, exit 1, INTERNAL)
    ├── InvalidRequest (400, exit 2, INVALID_ARGUMENT)  a request body or query that is not what
    │   │                                     the extender protocol or endpoint expects
    │   ├── SettingsError                     a DSEXT_* value or flag is invalid
    │   └── BodyNotJson                       wire: a verb's body that is not a JSON object (answered 400)
    └── ViewUnavailable (503, exit 7, UNAVAILABLE)  the watch-backed cluster view is not synced yet
"""

from __future__ import annotations

from dsplatform import errors as platform


class SchedulerPluginError(platform.PlatformError):
    """Base of every deliberate scheduler_plugin error."""


class InvalidRequest(platform.InvalidInput, SchedulerPluginError):
    code = "invalid_request"


class SettingsError(InvalidRequest):
    code = "invalid_setting"


class ViewUnavailable(platform.Unavailable, SchedulerPluginError):
    """The watch-backed cluster view is not synced yet."""


__all__ = ["InvalidRequest", "SchedulerPluginError", "SettingsError", "ViewUnavailable"]
