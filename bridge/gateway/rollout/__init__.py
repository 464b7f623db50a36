"""Rollout: which version serves whom (shadow, canary, live), decided from figures, with automatic rollback.

    controller.py  RolloutController: the facade the gateway and the Policies servicer call
    config.py      the rollout plan and the registry it persists in; decide.py the promote/rollback rules
    router.py      which version a session's step goes to; stats.py per-version runtime figures
    serving.py     a version READY and fingerprinted in Triton; publish.py a candidate through the gate
    follow.py      another gateway's registry changes, followed; views.py what status and the console read
    bounds.py      the action bounds the gate judges against, by who declared them

Nothing is re-exported: import the module you need.
"""
