"""Regenerate (or, with --check, verify) the committed Python modules of the wire APIs.

The generated modules are committed so that installing devplug needs no protoc; this
script is the one way they are produced, and the test suite runs it with --check.
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src"
PROTOS = sorted(SRC.glob("devplug/api/**/*.proto"))
OUTPUTS = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py", "_pb2_grpc.pyi")


def generate(out: Path) -> None:
    from grpc_tools import protoc  # dev dependency, imported only here

    bindir = Path(sys.executable).parent  # mypy-protobuf's protoc plugins live beside python
    plugins = [f"--plugin={bindir / name}" for name in ("protoc-gen-mypy", "protoc-gen-mypy_grpc")]
    for proto in PROTOS:
        rel = proto.relative_to(SRC)
        (out / rel.parent).mkdir(parents=True, exist_ok=True)
        args = [
            "protoc",
            f"-I{SRC}",
            *plugins,
            f"--python_out={out}",
            f"--grpc_python_out={out}",
            f"--mypy_out={out}",
            f"--mypy_grpc_out={out}",
            str(rel),
        ]
        if protoc.main(args) != 0:
            raise SystemExit(f"protoc failed on {rel}")


def generated_names(proto: Path) -> list[Path]:
    rel = proto.relative_to(SRC)
    return [rel.with_name(rel.stem + suffix) for suffix in OUTPUTS]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if committed files are stale")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        generate(out)
        stale = []
        for proto in PROTOS:
            for name in generated_names(proto):
                fresh, committed = out / name, SRC / name
                if args.check:
                    if not committed.exists() or not filecmp.cmp(fresh, committed, shallow=False):
                        stale.append(str(name))
                else:
                    shutil.copyfile(fresh, committed)
        if stale:
            print("stale generated modules (run `make proto`):", *stale, sep="\n  ")
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
