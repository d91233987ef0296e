"""dsagent: the node agent of dsplatform and its command line client ``dsctl``.

The agent digests datasets into manifests, packs small-file datasets into tar+zstd
bundles, caches them on the node's local disk, checks them by digest and evicts what is
unused. See docs/development.md for the architecture.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
