"""Generated data sets for the lessons: every task is produced from a seed, nothing is downloaded.

One module per task; each documents its grammar or rule and returns tensors ready for training.
"""
