"""The cluster-wide rules: pure policies the Dataset controller, the node agent and the
cluster simulator (``tools/sim``) all call, so that each decides alike.

No I/O, no clock, no event loop, no Kubernetes: functions of their inputs
(docs/design.md#layers). Modules:

- :mod:`dsagent.policy.eviction`: which cached versions to evict, and the 1.2x rule.
- :mod:`dsagent.policy.replication`: how many ready copies to keep, and where.
- :mod:`dsagent.policy.copies`: how many nodes hold each version ready.
- :mod:`dsagent.policy.stripegroup`: which nodes form a striped version's group.
- :mod:`dsagent.policy.preparation`: which waiting jobs' datasets to prepare on which node.
"""
