"""Control-step round trip through the gateway in plaintext, over TLS and over mTLS (client
certificates), side by side in one run; plus the time to open a session (channel + handshake + Hello
-> Welcome) on a fresh connection.

    python benchmarks/tls.py [--rounds 5 --per-round 300 --connects 30 --json PATH]

Three `tether gateway` processes (the same Triton model behind each), certificates from `tether
certs init` in a temp dir; rounds alternate between the three so load drifting on a shared machine
hits them alike. Prints a table and writes JSON (default benchmarks/results/tls.json).
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import time
from pathlib import Path

import numpy as np
from bench import machine, parser, report
from loop_latency import ACT, MODEL, OBS, percentiles
from loop_latency import Session as LoopSession

from bridge.client import Credentials
from bridge.security.certs import init_certs
from inference_server import ModelRepository, TritonServer
from tether.topology import gateway_process
from trainer.policy import MLPPolicy

MODES = ("plaintext", "tls", "mtls")


def Session(address: str, name: str, files: dict) -> LoopSession:  # noqa: N802 (used as a class)
    """One Bridge.Connect stream stepping a fixed observation over a channel with `files` (TLS or not):
    loop_latency's session (`bridge.client.Session`) with these credentials."""
    return LoopSession(address, name, credentials=Credentials(**files))


async def round_trips(address: str, files: dict, n: int, name: str) -> list[int]:
    async with Session(address, name, files) as s:
        return [await s.round_trip() for _ in range(n)]


async def connect_times(address: str, files: dict, n: int, name: str) -> list[int]:
    """Fresh channel each time: TCP + (TLS handshake) + HTTP/2 + Hello -> Welcome."""
    samples = []
    for i in range(n):
        t0 = time.perf_counter_ns()
        async with Session(address, f"{name}-{i}", files):
            samples.append(time.perf_counter_ns() - t0)
    return samples


def main(argv: list[str] | None = None) -> dict:
    p = parser(__file__, __doc__, rounds=(5, "alternating blocks per mode"), per_round=(300, "round trips per block"))
    p.add_argument("--connects", type=int, default=30, help="fresh sessions per mode (connect time)")
    a = p.parse_args(argv)
    run_dir = Path(tempfile.mkdtemp(prefix="tether-bench-tls-"))
    certs = run_dir / "certs"
    init_certs(certs, clients=[("bench", "robot")])
    server = ("--tls-cert", str(certs / "server.crt"), "--tls-key", str(certs / "server.key"))
    args = {"plaintext": (), "tls": server, "mtls": (*server, "--tls-client-ca", str(certs / "ca.crt"))}
    files = {"plaintext": {}, "tls": {"ca": certs / "ca.crt"},
             "mtls": {"ca": certs / "ca.crt", "cert": certs / "bench.crt", "key": certs / "bench.key"}}
    repo = ModelRepository(run_dir / "models")
    repo.write_version(MODEL, 1, MLPPolicy(OBS[0], ACT[0], seed=0), OBS, ACT)
    with TritonServer(repo.root, models=[MODEL], log_path=run_dir / "triton.log") as triton, \
            contextlib.ExitStack() as stack:
        gateways = {mode: stack.enter_context(gateway_process(
            triton_url=triton.grpc_url, policy=MODEL, log_path=run_dir / f"gateway-{mode}.log",
            extra_args=args[mode])) for mode in MODES}
        for mode in MODES:  # warm-up every path
            asyncio.run(round_trips(gateways[mode], files[mode], 100, f"warmup-{mode}"))
        steps: dict[str, list[int]] = {m: [] for m in MODES}
        connects: dict[str, list[int]] = {m: [] for m in MODES}
        for r in range(a.rounds):
            for mode in MODES:
                steps[mode] += asyncio.run(round_trips(gateways[mode], files[mode], a.per_round, f"lat{r}"))
                connects[mode] += asyncio.run(connect_times(gateways[mode], files[mode],
                                                            max(1, a.connects // a.rounds), f"c{r}"))
            print(f"  round {r + 1}/{a.rounds}: " + ", ".join(
                f"{m} p50 {np.median(steps[m]) / 1e6:.3f} ms" for m in MODES), flush=True)
        version = triton.version
    result = {
        "machine": machine(),
        "triton_version": version,
        "step_ms": {m: percentiles(steps[m]) for m in MODES},
        "connect_ms": {m: percentiles(connects[m]) for m in MODES},
        **{f"{m}_vs_plaintext_p50": float(np.median(steps[m]) / np.median(steps["plaintext"])) for m in MODES[1:]},
    }
    return report(a.json, result, print_table)


def print_table(r: dict) -> None:
    print(f"\n{'mode':<12}{'step p50 ms':>13}{'step p99 ms':>13}{'connect p50 ms':>16}{'connect p99 ms':>16}")
    for m in MODES:
        s, c = r["step_ms"][m], r["connect_ms"][m]
        print(f"{m:<12}{s['p50']:>13.3f}{s['p99']:>13.3f}{c['p50']:>16.2f}{c['p99']:>16.2f}")
    print(f"TLS / plaintext step p50: {r['tls_vs_plaintext_p50']:.2f}x, mTLS: {r['mtls_vs_plaintext_p50']:.2f}x\n")


if __name__ == "__main__":
    main()
