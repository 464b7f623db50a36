"""Regenerate the Python code for every `.proto` under `protos/`.

    python -m protos.generate            # writes next to the .proto files
    python -m protos.generate --out DIR  # writes into DIR (the staleness test compares)
"""

from __future__ import annotations

import argparse
import pathlib
import sys

from grpc_tools import protoc

ROOT = pathlib.Path(__file__).resolve().parent.parent


def proto_files() -> list[pathlib.Path]:
    return sorted((ROOT / "protos").rglob("*.proto"))


def generate(out: pathlib.Path = ROOT) -> None:
    include = pathlib.Path(protoc.__file__).parent / "_proto"
    files = [str(p.relative_to(ROOT)) for p in proto_files()]
    args = ["protoc", f"-I{ROOT}", f"-I{include}", f"--python_out={out}", f"--pyi_out={out}",
            f"--grpc_python_out={out}", *files]
    if protoc.main(args) != 0:
        raise SystemExit(f"protoc failed on {files}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=pathlib.Path, default=ROOT)
    generate(parser.parse_args(argv).out)


if __name__ == "__main__":
    main(sys.argv[1:])
