"""What a dataset is, offline: digests, manifests, bundles, stores and verification (``dsctl digest/pack/unpack``).

No event loop, web stack, cache root or Kubernetes here, so ``dsctl pack`` on a laptop imports none.
"""
