"""The agent's source allowlist: what a request may make the agent read, decided from text.

Who calls it: :func:`dsagent.cache.task.check_locations` (every dataset source and bundle
store of every request, before anything is recorded) and the agent's settings (the
defaults below). ``dsctl`` run by a user on their own machine does not use it: there the
user's own rights apply.

What it owns: the one decision "may the agent open this URL with these storage options",
made **before any filesystem object is constructed, any file opened or any path touched
outside the allowed local directories**. Checking the shape of a filesystem after fsspec
built it loses to the next wrapper fsspec adds (the async wrapper keeps its target in
``.sync_fs``), and building one may already act (``filecache`` creates
its ``cache_storage`` directory, ``tar://`` opens its ``fo``). So:

- the protocol comes from the URL's text (:func:`fsspec.core.split_protocol`, exactly what
  fsspec itself would pick), aliases folded (``s3a`` -> ``s3``, ``gcs`` -> ``gs``, ``abfs``
  -> ``az``, ``local`` -> ``file``), and must be in :attr:`SourcePolicy.protocols`;
- chains (``a::b``) are refused; an IPv6 literal (``http://[::1]:8080/x``) is not a chain;
- every storage-option key must be in the protocol's key allowlist, and values are plain
  JSON scalars, except keys allowed as ``key.*`` / ``key.sub`` (a mapping of scalars, e.g.
  HTTP ``headers``, S3 ``client_kwargs.region_name``);
- a local path (``/x``, ``file:///x``, ``local:///x``; never ``file://host/x``) is first
  checked lexically against ``DSAGENT_LOCAL_SOURCES`` (no syscall
  on a path outside them), then resolved (every symlink, ``..``) and checked again, and
  must be a directory or a regular file: a FIFO, socket or device is refused without
  being opened (opening a FIFO blocks a worker thread forever).

Every refusal is :class:`~dsagent.errors.InvalidInput` (400).

It also holds two URL and option rules that hold for ``dsctl`` too (called by
:func:`dsagent.format.storage.resolve` for every filesystem it builds): :func:`check_url`
calls near-URLs (``s3:/bucket``) malformed instead of taking them for local paths, and
:func:`check_option_values` refuses a flag that is not a boolean (``anon=maybe``) or an
endpoint that is not an http(s) URL with a host, before a backend takes it the wrong way.
"""

from __future__ import annotations

import os
import posixpath
import re
import stat
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from dsagent.errors import InvalidInput
from dsagent.format.egress import EgressPolicy, check_headers

#: The protocols an agent reads by default: object stores, HTTP(S), local paths.
DEFAULT_PROTOCOLS: tuple[str, ...] = ("s3", "gs", "az", "http", "https", "file")

#: Aliases fsspec accepts for the same filesystem, folded to one name before the check.
ALIASES: Mapping[str, str] = {
    "s3a": "s3",
    "gcs": "gs",
    "abfs": "az",
    "abfss": "az",
    "adl": "az",
    "local": "file",
}

#: Storage-option keys each protocol accepts: credentials, endpoint, region, anonymous
#: access. ``key.*`` allows a mapping of scalars under ``key``; ``key.sub`` allows just
#: ``sub`` in it. Nothing here names another filesystem, a local path or a callable.
DEFAULT_OPTION_KEYS: Mapping[str, tuple[str, ...]] = {
    "s3": (
        "anon",
        "key",
        "secret",
        "token",
        "endpoint_url",
        "region_name",
        "requester_pays",
        "use_ssl",
        "client_kwargs.region_name",
        "client_kwargs.endpoint_url",
        "client_kwargs.verify",
        "config_kwargs.signature_version",
        "config_kwargs.s3.addressing_style",
    ),
    "gs": ("project", "token", "access", "endpoint_url", "requester_pays", "anon"),
    "az": (
        "account_name",
        "account_key",
        "sas_token",
        "connection_string",
        "anon",
        "tenant_id",
        "client_id",
        "client_secret",
        "account_host",
    ),
    # no request headers by default: the operator names the ones a source needs
    # (``{"https": ["headers.Authorization"]}``); those metadata services require never pass
    "http": (),
    "https": (),
    "file": (),
    "memory": (),  # fsspec's process-local filesystem: allowed only by naming it (tests do)
}

#: Values a key may take when the default (any scalar) would reach host files: a ``gs``
#: token that is a string is a path to a credentials file, read by the privileged agent.
_STRING_VALUES: Mapping[tuple[str, str], frozenset[str]] = {("gs", "token"): frozenset({"anon"})}

_SCALARS = (str, bool, int, float, type(None))
_NEAR_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]+):(?!//)")
_SCHEMES_WITHOUT_SLASHES = {"data"}

#: Keys whose value has one meaning whatever the protocol: a flag must be a boolean (fsspec
#: backends take any truthy string, so ``anon=maybe`` would mean anonymous), an endpoint an
#: http(s) URL with a host (botocore's "Invalid endpoint" otherwise surfaces mid-fetch).
_BOOLEAN_KEYS = frozenset({"anon", "requester_pays", "use_ssl", "client_kwargs.verify"})
_ENDPOINT_KEYS = frozenset({"endpoint_url", "client_kwargs.endpoint_url"})


def check_option_values(options: Mapping[str, Any] | None) -> dict[str, Any]:
    """``options`` with each flag a boolean (``"true"``/``"false"`` strings, as a Secret
    holds them, become booleans), or InvalidInput for a value that cannot mean what its key
    says; before any filesystem is built, for dsctl (any key, the user's own rights) and the
    agent alike."""
    checked = {k: dict(v) if isinstance(v, Mapping) else v for k, v in (options or {}).items()}
    for key, value in _flat(options or {}):
        if key in _BOOLEAN_KEYS and not isinstance(value, bool):
            text = value.strip().lower() if isinstance(value, str) else None
            if text not in ("true", "false"):
                raise InvalidInput(
                    f"storage option {key!r} must be true or false, not {value!r}", hint=f"e.g. {key}=true"
                )
            top, _, sub = key.partition(".")
            if sub:
                checked[top][sub] = text == "true"
            else:
                checked[top] = text == "true"
        if key in _ENDPOINT_KEYS:
            parts = urlsplit(value) if isinstance(value, str) else None
            if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
                raise InvalidInput(
                    f"storage option {key!r} must be an http:// or https:// URL with a host, not {value!r}",
                    hint=f"e.g. {key}=http://minio.example:9000",
                )
    return checked


def _flat(options: Mapping[str, Any]) -> Iterator[tuple[str, Any]]:
    for key, value in options.items():
        if isinstance(value, Mapping):
            yield from ((f"{key}.{sub}", item) for sub, item in value.items())
        else:
            yield str(key), value


def known_option_keys() -> frozenset[str]:
    """Every storage-option key (leaf names too) some protocol admits by default: what a
    misspelt key is compared with."""
    keys = {k for allowed in DEFAULT_OPTION_KEYS.values() for k in allowed if "*" not in k}
    return frozenset(keys | {k.rsplit(".", 1)[-1] for k in keys})


@dataclass(frozen=True)
class Location:
    """What the check decided: the canonical protocol, and for local paths the resolved path."""

    url: str
    protocol: str
    local_path: str | None = None


@dataclass(frozen=True)
class SourcePolicy:
    """The operator's allowlist (``DSAGENT_PROTOCOLS``, ``DSAGENT_STORAGE_OPTION_KEYS``,
    ``DSAGENT_LOCAL_SOURCES``)."""

    protocols: tuple[str, ...] = DEFAULT_PROTOCOLS
    option_keys: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: dict(DEFAULT_OPTION_KEYS))
    local_sources: tuple[Path, ...] = ()
    #: where a request may make the agent connect (None: anywhere; the agent always has one)
    egress: EgressPolicy | None = None

    def check(self, url: str, storage_options: Mapping[str, Any] | None) -> Location:
        """Refuse ``url`` with ``storage_options`` unless the allowlist admits it. Only a
        local path inside ``local_sources`` is touched (stat'ed, its links resolved)."""
        return check_location(url, storage_options, self)


def check_url(text: str) -> None:
    """Refuse a near-URL such as ``s3:/bucket`` or ``s3:bucket`` (a typo, not a local path)."""
    match = _NEAR_URL.match(text)
    if match is None or match.group(1).lower() in _SCHEMES_WITHOUT_SLASHES:
        return
    import fsspec

    scheme = match.group(1).lower()
    if scheme in fsspec.available_protocols():
        rest = text[match.end() :].lstrip("/")
        raise InvalidInput(f"malformed URL {text!r}", hint=f"write {scheme}://{rest or 'bucket/path'}")


def canonical_protocol(url: str) -> str:
    """The protocol fsspec would use for ``url``, aliases folded; ``file`` for plain paths."""
    if is_chain(url):
        raise InvalidInput(
            f"{url!r} chains filesystems, which this agent does not accept",
            hint="give the dataset's own URL: the agent is the cache, and a chain could reach the node's local files",
        )
    from fsspec.core import split_protocol  # here: dsctl's local paths never import fsspec

    protocol, _ = split_protocol(url)
    name = (protocol or "file").lower()
    return ALIASES.get(name, name)


def is_chain(url: str) -> bool:
    """Whether ``url`` chains filesystems (``a::b``); the brackets of an IPv6 host are not a chain."""
    return "::" in re.sub(r"^([A-Za-z][A-Za-z0-9+.-]*://[^/\[]*)\[[0-9A-Za-z:.%_-]*\]", r"\1", url)


def check_location(url: str, storage_options: Mapping[str, Any] | None, policy: SourcePolicy) -> Location:
    if not isinstance(url, str) or not url or "\x00" in url:
        raise InvalidInput(f"invalid dataset location {url!r}", hint="give a local path or an allowed URL")
    check_url(url)  # 's3:/x' is a malformed URL, not a local path outside DSAGENT_LOCAL_SOURCES
    protocol = canonical_protocol(url)
    if protocol not in policy.protocols:
        raise InvalidInput(
            f"protocol {protocol!r} of {url!r} is not allowed on this agent",
            hint=f"use one of {', '.join(policy.protocols)} (the operator sets DSAGENT_PROTOCOLS)",
        )
    _check_options(protocol, storage_options, policy.option_keys.get(protocol, ()))
    if protocol != "file":
        if protocol in ("http", "https") and not urlsplit(url).hostname:
            raise InvalidInput(f"{url!r} names no host")
        if policy.egress is not None:
            _check_egress(protocol, url, storage_options or {}, policy.egress)
        return Location(url, protocol)
    return Location(url, protocol, _check_local(url, policy.local_sources))


#: The storage options that name a host the client connects to, per protocol.
_HOST_KEYS: Mapping[str, tuple[str, ...]] = {
    "s3": ("endpoint_url", "client_kwargs.endpoint_url"),
    "gs": ("endpoint_url",),
    "az": ("account_host",),
}


def _check_egress(protocol: str, url: str, options: Mapping[str, Any], egress: EgressPolicy) -> None:
    """The hosts ``url`` and its options make the agent connect to, each resolved and
    checked (:mod:`dsagent.format.egress`); the headers it would send, against the names
    metadata services require."""
    if protocol in ("http", "https"):
        egress.check_url(url, what=f"source {url!r}")
    for key, value in _flat(options):
        if key in _HOST_KEYS.get(protocol, ()) and isinstance(value, str) and value:
            if key in _ENDPOINT_KEYS:  # a URL (one without a scheme is refused by check_option_values)
                if "://" in value:
                    egress.check_url(value, what=f"storage option {key!r}")
            else:
                egress.check_host(value, None, what=f"storage option {key!r}")
    headers = options.get("headers")
    if isinstance(headers, Mapping):
        check_headers(list(headers))


def _check_options(protocol: str, options: Mapping[str, Any] | None, allowed: Sequence[str]) -> None:
    if options is None:
        return
    if not isinstance(options, Mapping):
        raise InvalidInput("storage options must be a JSON object")
    for key, value in options.items():
        nested = {a.split(".", 1)[1] for a in allowed if a.startswith(f"{key}.")}
        if key in allowed:
            _scalar(protocol, key, value)
        elif nested and isinstance(value, Mapping):
            for sub, item in value.items():
                if "*" not in nested and sub not in nested:
                    raise _key_refused(protocol, f"{key}.{sub}", allowed)
                _scalar(protocol, f"{key}.{sub}", item)
        else:
            raise _key_refused(protocol, str(key), allowed)


def _scalar(protocol: str, key: str, value: Any) -> None:
    if not isinstance(value, _SCALARS):
        raise InvalidInput(
            f"storage option {key!r} must be a string, number or boolean", hint="nested objects are not accepted here"
        )
    only = _STRING_VALUES.get((protocol, key))
    if only is not None and isinstance(value, str) and value not in only:
        raise InvalidInput(
            f"storage option {key!r} of {protocol!r} may not name a file on the node",
            hint=f"accepted strings: {sorted(only)}",
        )


def _key_refused(protocol: str, key: str, allowed: Iterable[str]) -> InvalidInput:
    names = ", ".join(allowed) or "none"
    return InvalidInput(
        f"storage option {key!r} is not accepted for {protocol!r} sources",
        hint=f"accepted keys: {names} (the operator sets DSAGENT_STORAGE_OPTION_KEYS)",
    )


def _local_text(url: str) -> str:
    """The path exactly as fsspec's local filesystem would take it from ``url``."""
    if "://" not in url:
        return url
    rest = url.split("://", 1)[1]
    if not rest.startswith("/"):  # file://host/x: fsspec would read host/x relative to its cwd
        raise InvalidInput(f"{url!r} names a host; local sources are paths on this node", hint="use file:///path")
    return rest


def _within(path: str, roots: Sequence[str]) -> bool:
    return any(path == root or path.startswith(root.rstrip(os.sep) + os.sep) for root in roots)


def _check_local(url: str, local_sources: Sequence[Path]) -> str:
    text = _local_text(url)
    if not os.path.isabs(text):
        raise InvalidInput(
            f"local source {url!r} is not an absolute path",
            hint="give the absolute path of a directory under DSAGENT_LOCAL_SOURCES",
        )
    lexical = posixpath.normpath(text)
    roots = [posixpath.normpath(os.fspath(r)) for r in local_sources]
    refused = InvalidInput(
        f"local source {url!r} is outside the directories this agent may read",
        hint="use a remote URL, or add its directory to DSAGENT_LOCAL_SOURCES on the agent",
    )
    if not _within(lexical, roots):
        raise refused  # nothing outside the allowed directories is even stat'ed
    real = os.path.realpath(lexical)
    if not _within(real, [os.path.realpath(r) for r in roots]):
        raise refused
    try:
        mode = os.stat(real).st_mode
    except FileNotFoundError:
        return real  # the fetch reports it as not found
    except OSError as exc:
        raise InvalidInput(f"local source {url!r} cannot be examined: {exc.strerror}") from exc
    if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
        raise InvalidInput(
            f"local source {url!r} is not a directory or a regular file (a FIFO, socket or device)",
            hint="datasets hold regular files only",
        )
    return real


__all__ = [
    "ALIASES",
    "DEFAULT_OPTION_KEYS",
    "DEFAULT_PROTOCOLS",
    "Location",
    "SourcePolicy",
    "canonical_protocol",
    "check_location",
    "check_option_values",
    "check_url",
    "is_chain",
    "known_option_keys",
]
