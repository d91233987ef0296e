"""Peer-to-peer bundles (docs/design.md#peers); being split into one module per concept."""

from dsagent.cache.peers.peerfetch import *  # noqa: F403
from dsagent.cache.peers.peerfetch import __all__  # noqa: F401
