"""Several Triton replicas behind one gateway: each synced, loaded and verified per version, steps routed.

    pool.py   TritonReplicas (the hot path and the control calls over all replicas), ReplicaMetrics
    sync.py   a version's folder copied to a replica's repository

Nothing is re-exported: import the module you need.
"""
