"""The bundle format: packing, encoding, reading and extracting tar+zstd bundles."""
