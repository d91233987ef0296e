"""The pack's default bundle caps: how many files and bytes one bundle holds at most.

Who calls it: the pack (:mod:`dsagent.format.bundles.bundle`, whose ``max_files``/``max_bytes``
default to them) and the Dataset controller (:mod:`dsagent.controller.striping`, which
bounds a stripe group by the bundles a version packs into). A module of its own, with no
imports, so that the controller need not load the pack's modules for two numbers.
"""

from __future__ import annotations

DEFAULT_MAX_FILES = 50_000
DEFAULT_MAX_BYTES = 800_000_000

__all__ = ["DEFAULT_MAX_BYTES", "DEFAULT_MAX_FILES"]
