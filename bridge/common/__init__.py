"""The bottom layer of `bridge`: small pieces every package shares, importing nothing else of bridge.

    from bridge.common.errors import TetherError, NotFound
    from bridge.common.files import write_atomic, write_json
    from bridge.common.kv import parse_pairs
    from bridge.common.logs import configure_logging, log_context
    from bridge.common.percentiles import percentile, p50_p99

Packages above (registry, security, gate, rewards, experience, then the gateway and the console)
import from here; nothing here imports them (tests/common/test_layering.py enforces the direction).
"""
