"""`tether gateway`'s flags: `bridge.gateway.config.add_arguments` plus `--log-format`. The process itself (the
gateway with the console composed on top, until SIGINT/SIGTERM) is `bridge.app.main`.

    tether gateway --triton 127.0.0.1:8001 --policy hopper_v5 --model-repository runs/models \
        --experience-dir runs/experience --console-port 8080
"""

from __future__ import annotations

import argparse

from bridge.gateway.config import add_arguments

__all__ = ["parse_args", "parser"]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tether gateway", description="Serve tether.v1.Bridge in front of Triton.")
    add_arguments(p)
    p.add_argument("--log-format", choices=("text", "json"), default="text",
                   help="json: one JSON object a line, with the session and policy version")
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    return parser().parse_args(argv)
