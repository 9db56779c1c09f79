"""Generated data sets for the lessons: every task is produced from a seed, nothing is downloaded.

One module per task; each documents its grammar or rule and returns tensors ready for training.
The lessons reach them through the package's top, as ``ac.tasks.translation.make_translation_data``.
"""

from attention_course.tasks import (
    heads,
    long_context,
    phrases,
    positions,
    reviews,
    sequences,
    stdlib_text,
    translation,
)

__all__ = ["heads", "long_context", "phrases", "positions", "reviews", "sequences", "stdlib_text", "translation"]
