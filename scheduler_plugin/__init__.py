"""scheduler_plugin: a kube-scheduler extender scoring dataset affinity, RoCE subnet and NUMA placement.

It reads what the node agents publish (Node annotations) and never imports the agent's code.
"""

__all__: list[str] = []
