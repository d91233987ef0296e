"""The Dataset controller: its own process (the chart's ``controller`` Deployment, ``python -m
dsagent.controller``), keeping every ``Dataset``'s status true and acting on its spec.

reconcile   the controller: settings, leader election, each resync's reconcile pass
prepare     next-job preparation's inputs read from pods and Nodes
storegc     the store gc Jobs (``dsctl gc --delete``) per bundle store
jobpod      the pod template of the Jobs it starts (pack and store gc)
"""
