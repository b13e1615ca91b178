"""Child-process side of ``harness.peak_rss_growth``: peak RSS growth of one call, in bytes.

The payload is read from a file (building it here would raise the peak before the call), every
module is imported and each function warmed on a tiny payload first, so the growth measured is
the call's own: the kernel's peak resident set size after it minus the peak before it.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout

import cases

_STATUS = Path("/proc/self/status")


def _status_bytes(field: str) -> int:
    for line in _STATUS.read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024  # reported in kB
    msg = f"{field} not in {_STATUS}"
    raise RuntimeError(msg)


def measure(case: str, name: str, payload_file: str) -> int:
    data = Path(payload_file).read_bytes()
    func = cases.runner(case, name)
    func(cases.warmup_payload(case))
    # ru_maxrss is inherited across fork and exec (a big parent hides the child's growth):
    # reset the kernel's peak (VmHWM) to the current RSS instead, then read it after the call.
    Path("/proc/self/clear_refs").write_text("5")
    before = _status_bytes("VmRSS")
    func(data)
    return max(_status_bytes("VmHWM") - before, 0)
