"""Timing and memory measurement: medians of interleaved runs in CPU time, RSS growth in a child."""

from __future__ import annotations

import gc
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

_TARGET_SECONDS_PER_REPEAT = 0.02


def median_seconds(
    funcs: dict[str, Callable[[], object]], *, repeats: int = 15
) -> dict[str, float]:
    """Median time of one call of each function, their timed batches interleaved.

    Each repeat times one batch of every function in turn (each batch loops enough calls to
    outlast timer noise, after one untimed call that warms the caches the other functions
    used), so a slow spell of the machine hits all of them alike and the ratios between them
    stay fair. Time is this process's CPU time: on a machine shared with other jobs, wall time
    also counts the spells this process waits for a core (measured: medians of repeated fresh
    runs varied up to 4x in wall time under a load of 4 on 2 cores, within 2% in CPU time).
    """
    loops = {}
    for name, func in funcs.items():
        func()  # warm up caches and lazily built decoders
        start = time.process_time()
        func()
        once = max(time.process_time() - start, 1e-7)
        loops[name] = max(1, int(_TARGET_SECONDS_PER_REPEAT / once))
    samples: dict[str, list[float]] = {name: [] for name in funcs}
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for _ in range(repeats):
            for name, func in funcs.items():
                func()  # untimed: the batch starts warm, as after the previous one of its own
                start = time.process_time()
                for _ in range(loops[name]):
                    func()
                samples[name].append((time.process_time() - start) / loops[name])
    finally:
        if gc_was_enabled:
            gc.enable()
    return {name: statistics.median(times) for name, times in samples.items()}


_CHILD = """
import sys
sys.path.insert(0, {bench_dir!r})
import memory_probe
print(memory_probe.measure({case!r}, {name!r}, {payload_file!r}))
"""


def peak_rss_growth(case: str, name: str, payload: bytes) -> int:
    """Peak RSS growth in bytes of one call of ``name`` on ``payload`` of ``case``, in a child.

    tracemalloc misreads orjson's over-allocated buffers, so the kernel's view is used: the peak
    resident set size after the call minus the peak before it.
    """
    bench_dir = str(Path(__file__).parent)
    with tempfile.NamedTemporaryFile(suffix=".json") as file:
        file.write(payload)
        file.flush()
        code = _CHILD.format(bench_dir=bench_dir, case=case, name=name, payload_file=file.name)
        done = subprocess.run(  # noqa: S603 - our own interpreter running our own probe
            [sys.executable, "-c", code], capture_output=True, text=True, check=True
        )
    return int(done.stdout.strip())
