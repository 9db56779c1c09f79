"""Grade exercise notebooks: ``python -m attention_course.grading PATH... [--json OUT] [--csv OUT]``.

Each PATH is a notebook or a folder (searched recursively for *.ipynb, skipping checkpoints). Prints a
score table; ``--json`` and ``--csv`` also write the results to files. Exit status 0 once grading is
complete, whatever the scores; 1 when there was nothing to grade; 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from attention_course.grading.exercises import exercise_ids
from attention_course.grading.grader import find_notebooks, grade_paths
from attention_course.grading.report import format_table, to_csv, to_json, write
from attention_course.grading.sandbox import DEFAULT_OUTPUT_LIMIT


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m attention_course.grading", description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="+", type=Path, help="notebooks or folders of notebooks")
    parser.add_argument("--json", type=Path, metavar="OUT", help="write the results as JSON to OUT")
    parser.add_argument("--csv", type=Path, metavar="OUT", help="write one row per notebook to OUT")
    parser.add_argument("--timeout", type=float, default=30.0, metavar="SECONDS",
                        help="time allowed for each graded cell and each part's checks (default 30)")
    parser.add_argument("--jobs", "-j", type=int, default=1, help="notebooks graded in parallel (default 1)")
    parser.add_argument("--seed", type=int, help="seed for the generated inputs (default: fresh per notebook)")
    parser.add_argument("--exercise", choices=exercise_ids(), help="grade every notebook as this exercise")
    parser.add_argument("--output-limit", type=int, default=DEFAULT_OUTPUT_LIMIT, metavar="BYTES",
                        help=f"output the learner's code may print per process (default {DEFAULT_OUTPUT_LIMIT:,})")
    parser.add_argument("--quiet", "-q", action="store_true", help="print only the summary table")
    args = parser.parse_args(argv)
    if args.timeout <= 0 or args.jobs < 1 or args.output_limit < 0:
        parser.error("--timeout must be > 0, --jobs >= 1 and --output-limit >= 0")

    if not find_notebooks(args.paths):
        print(f"nothing to grade: no notebooks under {[str(p) for p in args.paths]}", file=sys.stderr)
        return 1
    torch.set_num_threads(1)  # references are small; leave the cores to the learners' processes
    results = grade_paths(args.paths, timeout=args.timeout, jobs=args.jobs, seed=args.seed,
                          exercise_id=args.exercise, output_limit=args.output_limit)
    print(format_table(results, details=not args.quiet))
    if args.json:
        write(args.json, to_json(results))
    if args.csv:
        write(args.csv, to_csv(results))
    total = sum(r.score for r in results)
    print(f"\ngraded {len(results)} notebook(s); total {total}/{sum(r.max_score for r in results)} points")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
