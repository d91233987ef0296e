"""The Dataset controller: keeps every ``Dataset``'s status true and acts on its spec.

Who runs it: the chart's ``controller`` Deployment (``python -m dsagent.controller``, two
replicas, one leader by Lease). It is a separate Deployment rather than part of the extender
because it writes (Dataset status, Jobs, agent requests) while the extender only reads, and
because a slow object-store listing must never delay a scheduling decision. Each resync
(``DSAGENT_CONTROLLER_RESYNC``, 30 s) the leader runs one pass.

Modules, one concern each:

reconcile    the loop: leader check, one pass over the Nodes' inventories and every Dataset,
             ``status.readyNodes``, cleanup (``dsagent.io/cleanup``); ``main``
inventories  the inventories as the passes read them: each text parsed once, what each says
             read once, indexed by the datasets they list from pass to pass
passheap     the cyclic garbage collector kept off what a pass has read
controllersettings  ``DSAGENT_CONTROLLER_*``
leader       one leader among the replicas, by a ``coordination.k8s.io/v1`` Lease
agents       calls to the node agents: find them, hold a task on chosen nodes, read answers
packing      ``spec.pack.auto``: a pack Job per new source listing, ``status.pack``
warmup       ``spec.warm`` and ``spec.replicas``: copies held by agent tasks on chosen nodes
nextjob      next-job preparation: plan, put it on the agents, release what the plan dropped
orphans      what agents still hold for a deleted Dataset (warm-up, replicas, preparation),
             released within one pass
queues       the next job from what the cluster knows: Kueue, Volcano, dsagent.io/next-job
podfacts     what pods, Nodes and Datasets say (pure): waiting pods, expected ends, free
             GPUs, demand; inputs of preparation and replicas
quotas       the tenancy bounds (pure): what each namespace pins this pass, what is refused
copycounts   ready copies per dataset version, published for the agents' eviction
storegc      ``dsctl gc --delete`` Jobs per bundle store
migration    step 5 of the deadline design: evict opted-in jobs that would end sooner elsewhere
plangates    steps 3-6 for the gated workers of multi-worker jobs: plan across nodes, pin, lift the gate
jobpod       the pod template of the Jobs it starts (pack and store gc)
controllermetrics   its Prometheus registry and probe port
"""
