"""Benchmarks behind the figures the course reports (`make bench`).

Each benchmark is a module in this package with a ``run() -> dict`` function returning the JSON-ready
figures under one top-level key, registered in :data:`BENCHMARKS`. ``python -m attention_course.benchmarks``
runs them all (or those named on the command line), prints a table, and merges the results into
``_build/benchmarks.json`` so that figures from separate runs accumulate.
"""

# name in benchmarks.json -> module in this package that computes it
BENCHMARKS: dict[str, str] = {
    "capstone": "capstone",
    "kv_cache": "kv_cache",
    "tiled_attention": "tiled",
    "tiled_attention_training": "tiled_training",
    "gqa_kv_cache_bytes": "gqa_kv_cache",
    "mha_vs_torch_time_ratio": "mha",
    "grading_seconds_per_notebook": "grading",
    "notebook_check_seconds": "notebook_check",
    "decoder_lm": "decoder_lm",
    "induction_heads": "induction",
    "serving": "serving",
    "course_model": "course_model",
}
