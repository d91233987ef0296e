"""The node agent's cluster mode, and the Kubernetes plumbing every process shares.

The other processes have their own folders: the admission webhook (:mod:`dsagent.webhook`)
and the Dataset controller (:mod:`dsagent.controller`); both import the shared modules here.
Modules, each owning one concept:

Shared by the processes:

- :mod:`dsagent.cluster.apiclient`: the one place the ``kubernetes`` client is configured.
- :mod:`dsagent.cluster.datasets`: the ``Dataset`` custom resource: reading specs and current
  digests, writing status (``dsctl pack --publish``).
- :mod:`dsagent.cluster.lease`: reading and writing ``coordination.k8s.io`` Leases.
- the pod annotation ``dsagent.io/datasets`` is a wire contract: :mod:`dsplatform.wire.podannotations`.
- :mod:`dsagent.cluster.podenv`: the environment contract between the webhook and ``dsctl``.
- :mod:`dsagent.cluster.envnames`: every ``DSAGENT_*`` name, for start-up's check.

The node agent's cluster mode (``dsagent serve --kubernetes``):

- :mod:`dsagent.cluster.nodeagent`: :class:`ClusterAgent`, wiring the modules below to the CacheService.
- :mod:`dsagent.cluster.publisher`: what the agent writes on its Node (annotations, pure diffing).
- :mod:`dsagent.cluster.podwatch`: the list+watch loop over the pods bound to this node.
- :mod:`dsagent.cluster.peerlist`: which peer agents hold a version (from Node inventories).
- :mod:`dsagent.cluster.stablelinks`: ``$DSAGENT_DATASETS_DIR/<name>`` links per pod.

Only this package and the two cluster processes import ``kubernetes``; the rest of dsagent
works without a cluster.
"""
