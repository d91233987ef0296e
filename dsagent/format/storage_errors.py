"""How object-store failures reach dsagent: translated into one line.

Who calls it: :mod:`dsagent.format.storage` (``translate_errors`` maps what its block
raises), and the two catch-alls that must never show a traceback: the agent's per-dataset
task (:mod:`dsagent.cache.service`) and the ``dsctl`` edge (:mod:`dsagent.cli`).

What it owns:

- :func:`classify`: a foreign exception (the ``OSError`` family fsspec uses, botocore,
  aiohttp, google-auth, gcsfs, azure-core) -> the dsagent error it means, with a hint:

  ============================== =============================== ===========
  what happened                  error (code)                    exit / HTTP
  ============================== =============================== ===========
  store unreachable, timed out   SourceUnavailable (transient)   7 / 503
  no credentials, or refused     StorageCredentials              11 / 403
  credentials valid, not allowed StorageForbidden                12 / 403
  bucket, object or path absent  NotFound                        3 / 404
  changed between pinned reads   IntegrityError (integrity)      5 / 422
  an option the backend rejects  InvalidInput                    2 / 400
  ============================== =============================== ===========

  Classification walks the exception and its ``__cause__``/``__context__`` chain and
  looks at class *names and modules*, so this module imports none of the optional
  backends (s3fs, gcsfs, adlfs, aiohttp) and works whichever are installed.

Timeouts and retries are not here: they are a value the edges pass down
(:mod:`dsagent.format.storageconfig`).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping

from dsagent.errors import (
    DsagentError,
    IntegrityError,
    InvalidInput,
    NotFound,
    SourceUnavailable,
    StorageCredentials,
    StorageForbidden,
)

# Error codes object stores answer when the credentials themselves are the problem
# (S3 and compatibles, GCS, Azure); anything else that is a 403 is a permission problem.
_CREDENTIAL_CODES = {
    "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken", "TokenRefreshRequired",
    "InvalidClientTokenId", "AuthorizationHeaderMalformed", "MissingSecurityHeader", "UnrecognizedClientException",
    "AuthenticationFailed", "InvalidAuthenticationInfo", "NoAuthenticationInformation",
}  # fmt: skip
# Exception class names (any module) meaning "no usable credentials here".
_NO_CREDENTIALS = {
    "NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError", "DefaultCredentialsError",
    "RefreshError", "ClientAuthenticationError", "CredentialUnavailableError", "TransportError",
}  # fmt: skip
# The object changed between two reads pinned to its first version (docs/design.md#one-version-per-file):
# a 412 to If-Match / IfMatch, s3fs's own check, the stores' codes for a failed condition.
_CHANGED = {"FileExpired"}
_CHANGED_CODES = {"PreconditionFailed", "ConditionNotMet"}
#: What to do about an object that changed while it was read (however that was found).
CHANGED_HINT = "the source changed while caching: request the dataset again once it is quiet"
# Exception class names meaning "the endpoint could not be reached or did not answer in time".
_UNREACHABLE = {
    "EndpointConnectionError", "ConnectTimeoutError", "ReadTimeoutError", "ConnectionClosedError",
    "ClientConnectorError", "ClientConnectionError", "ServerDisconnectedError", "ServerTimeoutError",
    "ClientOSError", "ServiceRequestError", "ServiceResponseError", "FSTimeoutError", "ProxyConnectionError",
}  # fmt: skip


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _names(exc: BaseException) -> set[str]:
    return {cls.__name__ for cls in type(exc).__mro__}


def _family(exc: BaseException) -> str:
    """Which backend raised it: aws, gcs, azure or other (picks the credentials hint)."""
    for link in _chain(exc):
        module = type(link).__module__
        if module.startswith(("botocore", "aiobotocore", "s3fs", "boto3")):
            return "aws"
        if module.startswith(("google", "gcsfs")):
            return "gcs"
        if module.startswith(("azure", "adlfs")):
            return "azure"
    return "other"


def _service_code(exc: BaseException) -> str | None:
    """The store's own error code (botocore ``ClientError.response``, azure ``error_code``)."""
    for link in _chain(exc):
        response = getattr(link, "response", None)
        if isinstance(response, Mapping):
            code = (response.get("Error") or {}).get("Code")
            if code:
                return str(code)
        code = getattr(link, "error_code", None)
        if isinstance(code, str) and code:
            return code
    return None


def _http_status(exc: BaseException) -> int | None:
    for link in _chain(exc):
        for attr in ("status", "status_code", "code"):  # aiohttp deprecates .code
            value = getattr(link, attr, None)
            if isinstance(value, int) and 100 <= value < 600:
                return value
    return None


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."


CREDENTIALS_HINT = {
    "aws": "give credentials: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY in the environment "
    "(in a pod: env from a Secret), "
    "or the key/secret storage options; for S3-compatible stores also endpoint_url",
    "gcs": "give credentials: GOOGLE_APPLICATION_CREDENTIALS pointing at a service-account key "
    "(in a pod: a mounted Secret), "
    "or the token storage option",
    "azure": "give credentials: AZURE_STORAGE_ACCOUNT_NAME with AZURE_STORAGE_ACCOUNT_KEY "
    "or AZURE_STORAGE_CONNECTION_STRING "
    "in the environment (in a pod: env from a Secret), or the account_name/account_key storage options",
    "other": "check the store's credentials (environment variables or storage options)",
}


def classify(exc: BaseException, what: str) -> DsagentError | None:
    """The dsagent error ``exc`` means for ``what`` (e.g. "source 's3://b/x'"), or None if unknown."""
    if isinstance(exc, DsagentError):
        return exc
    names = set().union(*(_names(link) for link in _chain(exc)))
    family = _family(exc)
    service_code = _service_code(exc)
    status = _http_status(exc)
    detail = _short(exc)
    if isinstance(exc, TypeError):
        unknown = re.search(_UNEXPECTED_KEYWORD, str(exc))
        if unknown is not None:
            return InvalidInput(
                f"{what}: storage option {unknown.group(1)!r} is not accepted by this filesystem",
                hint=_option_hint(unknown.group(1)),
            )
        return None
    if isinstance(exc, NotImplementedError):  # fsspec's answer when a backend lacks the operation (HTTP writes)
        return InvalidInput(
            f"{what}: the store's filesystem cannot do this; HTTP(S) stores, for one, are read-only",
            hint="pack to a directory or an object store such as s3://, gs:// or az://",
        )
    if names & _CHANGED or service_code in _CHANGED_CODES or status == 412:
        return IntegrityError(f"{what}: the source changed while it was read ({detail})", hint=CHANGED_HINT)
    if names & _NO_CREDENTIALS or (service_code in _CREDENTIAL_CODES) or status == 401:
        return StorageCredentials(f"{what}: credentials missing or refused ({detail})", hint=CREDENTIALS_HINT[family])
    if "ParamValidationError" in names or "InvalidEndpoint" in names or "InvalidRegionError" in names:
        return InvalidInput(
            f"{what}: invalid storage option ({detail})",
            hint="check endpoint_url, region and the other storage options",
        )
    if (
        isinstance(exc, PermissionError)
        or service_code in {"AccessDenied", "AuthorizationFailure", "AuthorizationPermissionMismatch"}
        or status == 403
    ):
        return StorageForbidden(
            f"{what}: permission denied ({detail})",
            hint="the credentials work but may not do this: check the bucket policy or role",
        )
    if (
        isinstance(exc, FileNotFoundError)
        or "ResourceNotFoundError" in names
        or service_code in {"NoSuchBucket", "NoSuchKey", "ContainerNotFound", "BlobNotFound"}
    ):
        return NotFound(
            f"{what}: not found ({detail})", hint="check the bucket and path; dsctl pack never creates buckets"
        )
    if names & _UNREACHABLE or isinstance(exc, (ConnectionError, TimeoutError)) or "gaierror" in names:
        return SourceUnavailable(
            f"{what}: store unreachable ({detail})",
            hint="check endpoint_url / the URL and that the store is reachable from here; retry later",
        )
    if isinstance(exc, OSError):
        return SourceUnavailable(f"{what}: {detail}")
    if family != "other" or names & {
        "HttpError",
        "ClientResponseError",
        "HttpResponseError",
        "BotoCoreError",
        "ClientError",
    }:
        return SourceUnavailable(f"{what}: the store failed ({detail})")
    return None


def bodiless(exc: BaseException) -> bool:
    """Whether the store's answer carried no error code of its own (a HEAD request's 403 from
    S3: botocore then gives the status, ``"403"``, as the code)."""
    code = _service_code(exc)
    return code is None or code.isdigit()


_UNEXPECTED_KEYWORD = r"unexpected keyword argument '([^']+)'"  # compiled on first use: a failed call's


def _option_hint(key: str) -> str:
    """A misspelt storage-option key's likely meaning (the backends' own error names an
    internal class, e.g. aiobotocore's AioSession, that users never wrote)."""
    import difflib  # only for this error's hint

    from dsagent.format.sources import known_option_keys  # here: a local digest never imports the URL rules

    close = difflib.get_close_matches(key, sorted(known_option_keys()), n=2, cutoff=0.75)
    if close:
        return "did you mean " + " or ".join(repr(c) for c in close) + "?"
    return "check the option names for this protocol (docs/user-guide/storage.md)"


__all__ = ["CHANGED_HINT", "CREDENTIALS_HINT", "bodiless", "classify"]
