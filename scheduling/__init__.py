"""The scheduling model shared by the two processes that reason about jobs and nodes: the
scheduler extender (:mod:`scheduler_plugin`) scores with it, the Dataset controller
(:mod:`dsagent.controller`) predicts and migrates with it, the admission webhook
(:mod:`dsagent.webhook`) applies deadline plans with it. Pure: no I/O, no clock, no
Kubernetes client, no web stack; it imports only :mod:`gpu_topology` and :mod:`dsplatform`.

timemodel    the deadline design's time model: a job's run time, plans, the annotations that
             describe a job
plans        the plan decision over the nodes as their agents publish them (advice and applied)
gatedjobs    the plan of a gated multi-worker job: its workers read, grouped, planned across
             nodes, ordered by slack, each given its node (the controller's plan loop)
nodefit      which nodes a pod's own rules allow (node selector, node affinity, taints)
pinning      what a placement may change on a pod: node affinity narrowed, gates, annotations
podspec      what a pod asks for: GPUs, datasets, RoCE classes, its job profile
nodeinfo     what a node offers, read from the agents' annotations: topology, free GPUs,
             held datasets, RoCE classes; the bandwidth a placement gets
migration    step 5's policy: which running jobs would end sooner elsewhere, their move paid
kubeobjects  the fields of a Pod and a Node the model reads, as JSON types

Why a package of its own: the controller must not import the extender (a process's code stays
in its folder), and the extender must not import the agent; both need the same reading of a
pod and a node, so that what one predicts the other scores.
"""
