"""The admission webhook: what a pod gets when it asks for datasets or GPUs.

server      the HTTPS edge: AdmissionReview in, JSONPatch out (``python -m
            dsagent.webhook``)
mutation    the pure pod -> JSONPatch function: init-container, env, hostPath wiring
csiwiring   the CSI wiring (the default): one inline ``csi`` volume per pod
roceclass   one RoCE class (or class set) per job, held by a Lease
injection   what the chart says to inject (image, paths, volume mode)
jsonpatch   RFC 6902 operations
"""
