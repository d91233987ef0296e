"""The Kubernetes plumbing the platform's processes share.

Imported by the node agent (:mod:`dsagent.nodeagent`), the admission webhook
(:mod:`dsagent.webhook`) and the Dataset controller (:mod:`dsagent.controller`); it imports
none of them, nor the node service. Modules, each owning one concept:

- :mod:`dsagent.kube.apiclient`: the one place the ``kubernetes`` client is configured.
- :mod:`dsagent.kube.datasets`: the ``Dataset`` custom resource: reading specs and current
  digests, writing status (``dsctl pack --publish``).
- :mod:`dsagent.kube.lease`: reading and writing ``coordination.k8s.io`` Leases.
- :mod:`dsagent.kube.events`: recording Events.
- :mod:`dsagent.kube.podenv`: the environment contract between the webhook and ``dsctl``.
- :mod:`dsagent.kube.envnames`: start-up's check for unknown ``DSAGENT_*`` variables, given
  each process's own settings classes.
- :mod:`dsagent.kube.stablelinks`: ``$DSAGENT_DATASETS_DIR/<name>`` links per pod.
- :mod:`dsagent.kube.leaving`: whether a Node is being drained or removed.
- :mod:`dsagent.kube.nodestate`: the Nodes with their ``NodeCache`` overlaid, listed (the
  webhook; the controller until its watch has listed them).
- :mod:`dsagent.kube.nodewatch`: the same, kept current by list+watch (the controller).
- :mod:`dsagent.kube.testing`: agent processes for tests and benchmarks.

The pod annotation ``dsagent.io/datasets`` is a wire contract: :mod:`dsplatform.wire.podannotations`.
"""
