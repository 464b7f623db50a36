"""Sessions: a Hello becoming a session, its steps batched into Triton, its limits, holds and records.

    factory.py   SessionFactory: Hello -> Session | VectorSession (ids, next steps, admission, ownership)
    service.py   BridgeService: the tether.v1.Bridge servicer (thin: streams in, replies out)
    session.py   Session (one environment), vector.py VectorSession (N environments in one stream)
    batcher.py   MicroBatcher: concurrent sessions' steps as one Triton request
    limits.py    session caps and per-message checks; holds.py operators' e-stops and the held replies
    recorder.py  transitions to the experience log; owners.py session ownership across gateways
    figures.py   per-session figures and the hot-path metrics

Nothing is re-exported: import the module you need.
"""
