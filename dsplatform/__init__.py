"""dsplatform: the vocabulary every component of the platform shares.

Who calls it: ``dsagent`` (pack, the agent, the kube code, the CLI), ``scheduler_plugin``
(the extender reads the same annotations and settings syntax) and the tools.
What it owns: one rule per fact that more than one component must agree on:

- :mod:`dsplatform.names`: what a dataset name and a digest look like;
- :mod:`dsplatform.units`: the byte-size and duration syntax of every setting and flag;
- :mod:`dsplatform.jobs`: which job a pod belongs to (its job labels);
- :mod:`dsplatform.kubetime`: how a Kubernetes time (RFC 3339) is read and written;
- :mod:`dsplatform.gpus`: how many GPUs a pod requests, and the GPU resource names;
- :mod:`dsplatform.paths`: the per-user cache base (``$XDG_CACHE_HOME``, else ``~/.cache``);
- :mod:`dsplatform.listwatch`: the list+watch loop of every reader that keeps a Kubernetes
  resource current (the client passed in: this package imports none);
- :mod:`dsplatform.wire`: the wire contracts between processes (the pod annotation, the CSI
  volume attributes), one module each, with its version.

It imports nothing of the project (an import contract checks this), so every package may
depend on it. :mod:`dsplatform.errors` holds the one error base every package's tree derives
from (code, HTTP status, exit code, gRPC status); this package's own errors are also
:class:`ValueError` subclasses, so pydantic and click accept them as is.
"""

from __future__ import annotations

from dsplatform.errors import PlatformError, VocabularyError
from dsplatform.jobs import DEFAULT_JOB_LABELS, job_key
from dsplatform.names import DIGEST_LENGTH, NAME_MAX_LENGTH, is_digest, is_name
from dsplatform.units import UnitError, format_size, parse_duration, parse_size

__all__ = [
    "DEFAULT_JOB_LABELS",
    "DIGEST_LENGTH",
    "NAME_MAX_LENGTH",
    "PlatformError",
    "UnitError",
    "VocabularyError",
    "format_size",
    "is_digest",
    "is_name",
    "job_key",
    "parse_duration",
    "parse_size",
]
