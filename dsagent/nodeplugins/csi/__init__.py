"""The CSI node plugin (CSI v1, ``datasets.dsagent.io``): a pod's datasets as a read-only volume.

driver    the Identity and Node services: NodePublishVolume asks the cache service for the
          pod's task and bind-mounts its versions; NodeUnpublishVolume releases it
volumes   the published-volume records (one JSON file each, written atomically)
mounts    read-only bind mounts and their undoing (the only module that calls mount(2))
"""
