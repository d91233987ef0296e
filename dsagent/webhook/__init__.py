"""The admission webhook: what a pod gets when it asks for datasets or GPUs. Its own process
(the chart's ``webhook`` Deployment, ``python -m dsagent.webhook``).

server        the HTTPS edge: AdmissionReview in, JSONPatch out; :func:`~dsagent.webhook.server.decide`
              is the injection decision (which datasets, which GPU class, what patch)
mutation      the pure pod -> JSONPatch function: init-container, env, hostPath wiring
csiwiring     the CSI wiring (the default): one inline ``csi`` volume per pod
injectconfig  what the chart says to inject (image, paths, volume mode): values, no decision
roceclass     one RoCE class (or class set) per job: the cluster vote, held by a Lease
gpurequest    a pod's GPU request and its rewrite into the class resource (pure), its settings
jsonpatch     RFC 6902 operations
"""
