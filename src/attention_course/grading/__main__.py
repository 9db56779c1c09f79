"""Grade exercise notebooks: ``python -m attention_course.grading PATH... [--json OUT] [--csv OUT]``.

Each PATH is a notebook or a folder (searched recursively for *.ipynb, skipping checkpoints). Prints a
score table; ``--json`` and ``--csv`` also write the results to files. ``--roster`` names the learners
(CSV: ``file`` or ``email``, ``learner_id``, ``name``), ``--summary DIR`` writes a class summary with a
histogram (the roster's learners who sent nothing are listed as missing), ``--feedback DIR`` one feedback
file per learner (first-level hints; ``--feedback-approach-hints`` adds the second). Parts earn marks per case
passed unless ``--all-or-nothing``. Exit status 0 once grading is complete, whatever the scores; 1 when there was
nothing to grade; 2 for bad arguments (an unreadable roster included); 3 when learners' code
cannot be isolated (bubblewrap missing: see ``make grader-deps``, or ``--no-sandbox``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from attention_course.grading import memory_cgroup
from attention_course.grading.exercises import exercise_ids
from attention_course.grading.grader import UNISOLATED, SandboxUnavailable, find_notebooks, grade_paths
from attention_course.grading.report import (
    class_summary,
    feedback_files,
    format_table,
    load_roster,
    to_csv,
    to_json,
    write,
)
from attention_course.grading.sandbox import BUDGET_STEPS, DEFAULT_OUTPUT_LIMIT


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m attention_course.grading", description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="+", type=Path, help="notebooks or folders of notebooks")
    parser.add_argument("--json", type=Path, metavar="OUT", help="write the results as JSON to OUT")
    parser.add_argument("--csv", type=Path, metavar="OUT", help="write one row per notebook to OUT")
    parser.add_argument("--timeout", type=float, default=30.0, metavar="SECONDS",
                        help="time allowed for each graded cell and each part's checks (default 30)")
    parser.add_argument("--budget", type=float, metavar="SECONDS",
                        help=f"time one notebook's code may take in all, retries included (default "
                             f"{BUDGET_STEPS} times --timeout, whatever its number of cells)")
    parser.add_argument("--jobs", "-j", type=int, default=1, help="notebooks graded in parallel (default 1)")
    parser.add_argument("--seed", type=int, help="seed for the generated inputs (default: fresh per notebook)")
    parser.add_argument("--exercise", choices=exercise_ids(), help="grade every notebook as this exercise")
    parser.add_argument("--output-limit", type=int, default=DEFAULT_OUTPUT_LIMIT, metavar="BYTES",
                        help=f"output the learner's code may print per process (default {DEFAULT_OUTPUT_LIMIT:,})")
    parser.add_argument("--no-sandbox", action="store_true",
                        help="run learners' code WITHOUT operating-system isolation (bubblewrap), with your own "
                             "rights: only for your own notebooks, never for a class (warned on every run)")
    parser.add_argument("--quiet", "-q", action="store_true", help="print only the summary table")
    parser.add_argument("--all-or-nothing", action="store_true",
                        help="a part earns its points only if every case passes (default: per case passed)")
    parser.add_argument("--roster", type=Path, metavar="CSV",
                        help="learners: columns file or email, learner_id, name; adds them to the table and CSV")
    parser.add_argument("--summary", type=Path, metavar="DIR",
                        help="write DIR/summary.md (pass rate, median marks per part) and DIR/scores.png")
    parser.add_argument("--feedback", type=Path, metavar="DIR", help="write one feedback file per learner to DIR")
    parser.add_argument("--feedback-format", choices=["md", "html"], default="md",
                        help="feedback files as Markdown (default) or HTML")
    parser.add_argument("--feedback-approach-hints", action="store_true",
                        help="feedback files also give each failed part's second hint, the approach (default: "
                             "only the first, the concept, as a learner's first check.hint does)")
    args = parser.parse_args(argv)
    if args.timeout <= 0 or args.jobs < 1 or args.output_limit < 0 or (args.budget is not None and args.budget <= 0):
        parser.error("--timeout and --budget must be > 0, --jobs >= 1 and --output-limit >= 0")
    roster = None
    if args.roster is not None:
        try:
            roster = load_roster(args.roster)
        except (OSError, ValueError, UnicodeDecodeError) as exc:
            parser.error(f"--roster: {exc}")

    if not find_notebooks(args.paths):
        print(f"nothing to grade: no notebooks under {[str(p) for p in args.paths]}", file=sys.stderr)
        return 1
    torch.set_num_threads(1)  # references are small; leave the cores to the learners' processes
    if args.no_sandbox:
        print(f"WARNING: {UNISOLATED}: learners' code can read and change your files, the other submissions "
              "and the grades, and reach the network. Never use --no-sandbox for a real class.", file=sys.stderr)
    if not args.no_sandbox:
        warning = memory_cgroup.fallback_message()
        if warning:
            print(warning, file=sys.stderr)
    try:
        results = grade_paths(args.paths, timeout=args.timeout, jobs=args.jobs, seed=args.seed,
                              exercise_id=args.exercise, output_limit=args.output_limit,
                              all_or_nothing=args.all_or_nothing, budget=args.budget,
                              isolation="none" if args.no_sandbox else "required")
    except SandboxUnavailable as exc:
        print(f"refusing to grade: {exc}", file=sys.stderr)
        return 3
    print(format_table(results, details=not args.quiet, roster=roster))
    if args.json:
        write(args.json, to_json(results, roster))
    if args.csv:
        write(args.csv, to_csv(results, roster))
    if args.summary:
        write(args.summary / "summary.md", class_summary(results, figure=args.summary / "scores.png", roster=roster))
    if args.feedback:
        feedback_files(results, args.feedback, roster, args.feedback_format,
                       hint_levels=2 if args.feedback_approach_hints else 1)
    if roster is not None:
        missing = roster.missing([r.path for r in results])
        if missing:
            print(f"\nno notebook from {len(missing)} learner(s) of the roster: "
                  + ", ".join(learner_id + (f" ({name})" if name else "") for learner_id, name in missing))
    total = round(sum(r.score for r in results), 2)
    print(f"\ngraded {len(results)} notebook(s); total {total:g}/{sum(r.max_score for r in results)} points")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
