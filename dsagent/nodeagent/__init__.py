"""The node agent (``dsagent serve``): its composition root and its cluster mode.

The node agent is one process built from the layers below it: the node service
(:mod:`dsagent.cache`), its HTTP API (:mod:`dsagent.api`) and its kubelet plugins
(:mod:`dsagent.nodeplugins`). This package wires them together and holds what only the node
agent does in a cluster (``dsagent serve --kubernetes``). Modules, each owning one concept:

- :mod:`dsagent.nodeagent.nodeparts`: the companions and hooks the service runs with, and
  :data:`~dsagent.nodeagent.nodeparts.SETTINGS`, every settings class the process reads.
- :mod:`dsagent.nodeagent.clusteragent`: :class:`ClusterAgent`, wiring the modules below to the CacheService.
- :mod:`dsagent.nodeagent.clusterhooks`: the hooks cluster mode lends the service (task guard, peers).
- :mod:`dsagent.nodeagent.clustersettings`: cluster mode's own ``DSAGENT_*`` settings.
- :mod:`dsagent.nodeagent.publisher`: what the agent writes on its Node (annotations, pure diffing).
- :mod:`dsagent.nodeagent.podwatch`: the list+watch loop over the pods bound to this node.
- :mod:`dsagent.nodeagent.podevents`: the Events the agent records on pods.
- :mod:`dsagent.nodeagent.peerlist`: which peer agents hold a version (from Node inventories).

The other processes have their own folders: the admission webhook (:mod:`dsagent.webhook`)
and the Dataset controller (:mod:`dsagent.controller`). What they share with the node agent
is below all three: the Kubernetes plumbing (:mod:`dsagent.kube`) and the cluster-wide rules
(:mod:`dsagent.policy`).
"""
