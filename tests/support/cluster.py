"""What a whole cluster (`tether cluster up`'s roles) needs on this machine, for the tests that start one.

    @needs_cluster                      # skipped, naming the first piece missing, where one is
    def test_cluster_up_...(tmp_path):
"""

from __future__ import annotations

import pytest

from inference_server import triton_binary
from tether.cluster.nats import nats_server_binary
from tether.cluster.postgres import postgres_bin_dir

__all__ = ["missing", "needs_cluster"]


def missing() -> str:
    """The first of PostgreSQL, nats-server and tritonserver not installed here; "" when all are."""
    for name, found in (("PostgreSQL (initdb, postgres)", postgres_bin_dir()), ("nats-server", nats_server_binary())):
        if not found:
            return name
    try:
        triton_binary()
    except Exception:  # noqa: BLE001 - any reason it is absent
        return "tritonserver (nvidia-pytriton)"
    return ""


needs_cluster = pytest.mark.skipif(bool(missing()), reason=f"needs {missing()}")
