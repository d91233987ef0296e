"""The wire contracts between the platform's processes: one module per contract, each with its
version, imported by the writer and by every reader, each with a round-trip test.

podannotations  the pod annotation ``dsagent.io/datasets`` (the pod's author writes it; the
                webhook, the node agent, the extender and the controller read it)
csivolume       the CSI volume attributes (the webhook writes them into the pod's inline
                ``csi`` volume; the agent's CSI node plugin reads them from ``NodePublishVolume``)
agenttask       the agent API's task bodies (dsctl, the init-container and the controller write
                the request and read the status; the agent reads the one, writes the other)
inventory       the node inventory (the agent writes it, as ``GET /v1/inventory`` and in its
                ``NodeCache``; the peers, the extender and the controller read it)
nodecache       the ``NodeCache`` custom resource: where a node's inventory and topology live
                (the agent writes it; the extender, the controller, the webhook and the peers
                read it, or an older agent's Node annotations)
peerbundle      the peer bundle request's marker that a reader waits for the bundle (the
                asking agent writes it; the serving agent's peer route reads it)
stripehold      the agent API's stripe hold request and what of its answer is read (the
                controller and ``dsctl stripe hold`` write the request; the agent reads it)

Pure values and parsers: no I/O, nothing of the processes; errors are
:class:`dsplatform.errors.InvalidInput` naming the field, or
:class:`dsplatform.boundedjson.JsonRefused` for JSON over its bounds.
"""
