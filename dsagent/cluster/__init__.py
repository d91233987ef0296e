"""Cluster mode of the node agent: everything that talks to Kubernetes.

Modules, each owning one concept:

- :mod:`dsagent.webhook`: the admission webhook (its own package).
- :mod:`dsagent.cluster.annotation`: the pod annotation ``dsagent.io/datasets`` (pure parsing).
- :mod:`dsagent.cluster.podenv`: the environment contract between the webhook and ``dsctl``.
- :mod:`dsagent.cluster.datasets`: the ``Dataset`` custom resource: reading specs and current
  digests, writing status (``dsctl pack --publish``).
- :mod:`dsagent.cluster.apiclient`: the one place the ``kubernetes`` client is configured.
- :mod:`dsagent.cluster.publisher`: what the agent writes on its Node (annotations, pure diffing).
- :mod:`dsagent.cluster.podwatch`: the list+watch loop over the pods bound to this node.
- :mod:`dsagent.cluster.peerlist`: which peer agents hold a version (from Node inventories).
- :mod:`dsagent.cluster.stablelinks`: ``$DSAGENT_DATASETS_DIR/<name>`` links per pod.
- :mod:`dsagent.cluster.nodeagent`: :class:`ClusterAgent`, wiring the above to the CacheService.
- :mod:`dsagent.controller.reconcile`: the Dataset controller (readyNodes, pack Jobs, warm-up,
  cleanup; one leader by Lease), run by its own Deployment; :mod:`dsagent.controller.prepare`
  its next-job preparation inputs.

Only this package imports ``kubernetes``; the rest of dsagent works without a cluster.
"""
