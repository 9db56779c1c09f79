"""How fast is this machine now? CPU seconds of a fixed workload like the lessons', on one thread.

    python _ext/cpu_calibration.py      # prints {"cpu_s": ...}: the median of five repetitions

The lessons' budgets (COURSE.md "Performance budgets": each lesson within 90 s, the whole book within 660 s)
are seconds of kernel CPU on the **reference machine**, a two-core machine that runs this workload in
``REFERENCE_CPU_S`` seconds. Kernel CPU time does not count the time a kernel waits for a core, but it does
grow when the core itself is slower: an older processor, or a virtual core whose sibling another tenant keeps
busy. Nearly the same notebooks took 518 s and 829 s of kernel CPU on one machine on one day (2026-11-29), the
second while the host was loaded, and CI 492 s and 807 s on two runs of nearly the same lessons. So the
execution workers time this workload just before each notebook and just after it, in the conditions the notebook meets
(``_ext/course_execution.py``: in a process forked from the kernel zygote, while the other worker runs its
own notebook), every notebook's record keeps the figure, and the budget tests convert the notebook's CPU
time to the reference machine's seconds: ``cpu_s * REFERENCE_CPU_S / calibration_cpu_s``. The Runtimes page
shows both.

The workload is plain PyTorch (no course code, so a faster library does not change the yardstick): training
steps of a small Transformer encoder, as most lessons run, on one thread as the kernels do.
"""

from __future__ import annotations

import json
import os
import time

# This workload's CPU seconds (the median of its runs, beside a busy core, as in a build) on the reference
# machine: this project's two-core build machine as it ran the book's 08:38 build of 2026-11-29 (518 s of
# kernel CPU). The workload did not exist then, so the figure is fitted. In a fresh build at 14:35 the eight
# lessons unchanged since then (02-07, 10, 12) took 1.15-1.26 times their morning kernel CPU; each one's
# calibration times its morning/now ratio gives 0.202-0.218 s, and the median is the reference.
REFERENCE_CPU_S = 0.211
REPETITIONS, STEPS = 5, 30  # five: one notebook's verdict rests on one calibration (three scattered by ±7%)


def workload(steps: int = STEPS) -> None:
    import torch
    from torch import nn

    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(32, 4, dim_feedforward=64, dropout=0.0, batch_first=True)
    model = nn.Sequential(nn.Embedding(64, 32), nn.TransformerEncoder(layer, 2, enable_nested_tensor=False),
                          nn.Linear(32, 64))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    tokens = torch.randint(0, 64, (32, 24), generator=torch.Generator().manual_seed(0))
    for _ in range(steps):
        logits = model(tokens)  # (32, 24, 64)
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), tokens.flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def measure(repetitions: int = REPETITIONS) -> float:
    """The median of ``repetitions`` runs of the workload, in CPU seconds of this process (PyTorch imported
    and warmed up first, not counted)."""
    import torch

    torch.set_num_threads(1)
    workload(steps=3)  # warm-up: first-call costs are not the machine's speed
    times = []
    for _ in range(repetitions):
        start = time.process_time()
        workload()
        times.append(time.process_time() - start)
    return sorted(times)[len(times) // 2]


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    print(json.dumps({"cpu_s": round(measure(), 4)}))
