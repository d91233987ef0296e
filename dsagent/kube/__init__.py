"""Cluster mode of the node agent: everything that talks to Kubernetes.

Modules, each owning one concept:

- :mod:`dsagent.kube.annotation`: the pod annotation ``dsagent.io/datasets`` (pure parsing).
- :mod:`dsagent.kube.datasets`: the ``Dataset`` custom resource: reading specs and current
  digests, writing status (``dsctl pack --publish``).
- :mod:`dsagent.kube.mutation`: the webhook's pure pod -> JSONPatch function.
- :mod:`dsagent.kube.webhook`: the admission webhook's HTTP edge and server.
- :mod:`dsagent.kube.publisher`: what the agent writes on its Node (annotations, pure diffing).
- :mod:`dsagent.kube.podwatch`: the list+watch loop over the pods bound to this node.
- :mod:`dsagent.kube.agent`: :class:`ClusterAgent`, wiring the above to the CacheService.
- :mod:`dsagent.kube.controller`: the Dataset controller (readyNodes, pack Jobs, warm-up,
  cleanup; one leader by Lease), run by its own Deployment.

Only this package imports ``kubernetes``; the rest of dsagent works without a cluster.
"""
