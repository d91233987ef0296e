"""The node service: one coordinator (:mod:`dsagent.cache.service`) and its parts.

Requests, fetching, space, recovery and serving for the node agent; the rules it decides by
are :mod:`dsagent.policy`.
"""
