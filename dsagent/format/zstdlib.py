"""The zstd binding that reads one frame at a time: ``compression.zstd`` on Python 3.14 and
later, its backport (``backports.zstd``, the same API) before; imported here alone.

Who imports it: :mod:`dsagent.format.framereader` (manifests, and what of a bundle is not a
run of whole frames) and :func:`dsagent.format.zstdframes.decode_whole` (libzstd's frame
walk, ``get_frame_size``); python-zstandard (``zstandard``) decodes the runs of whole frames
and writes bundles. Not imported by a process that reads no zstd (the digest).
"""

from __future__ import annotations

try:  # Python 3.14+
    from compression import zstd
except ImportError:  # pragma: no cover - depends on the Python version
    from backports import zstd

__all__ = ["zstd"]
