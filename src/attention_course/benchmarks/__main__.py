"""Run the course's benchmarks: ``python -m attention_course.benchmarks [NAME ...] [--out PATH]``."""

from __future__ import annotations

import argparse
import importlib
import json
import platform
import time
from pathlib import Path

import torch

from attention_course.benchmarks import BENCHMARKS


def _flatten(prefix: str, value: object) -> list[tuple[str, str]]:
    if isinstance(value, dict):
        rows: list[tuple[str, str]] = []
        for key, inner in value.items():
            rows.extend(_flatten(f"{prefix}.{key}", inner))
        return rows
    if isinstance(value, float):
        return [(prefix, f"{value:.4g}")]
    return [(prefix, str(value))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("names", nargs="*", help=f"benchmarks to run (default: all of {sorted(BENCHMARKS)})")
    parser.add_argument("--out", type=Path, default=Path("_build/benchmarks.json"))
    args = parser.parse_args(argv)

    unknown = [name for name in args.names if name not in BENCHMARKS]
    if unknown:
        parser.error(f"unknown benchmark(s) {unknown}; choose from {sorted(BENCHMARKS)}")
    names = args.names or list(BENCHMARKS)

    results = json.loads(args.out.read_text()) if args.out.exists() else {}
    for name in names:
        module = importlib.import_module(f"attention_course.benchmarks.{BENCHMARKS[name]}")
        start = time.perf_counter()
        results[name] = module.run()
        print(f"[{name}] done in {time.perf_counter() - start:.1f} s", flush=True)

    results["environment"] = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpu_count": torch.get_num_threads(),
        "cuda": torch.cuda.is_available(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")

    rows = [row for name in names for row in _flatten(name, results[name])]
    width = max(len(key) for key, _ in rows) if rows else 10
    print(f"\n{'figure':<{width}}  value")
    for key, value in rows:
        print(f"{key:<{width}}  {value}")
    print(f"\nwritten to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
