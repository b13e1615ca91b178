"""Run the fuzz target for a bounded time; fail on any finding, hang or memory growth.

    python fuzz/run.py --seconds 600 [--runs N] [--jobs J] [--timeout 5] [--rss-limit-mb 2048]

libFuzzer (through atheris) stops at the first input that raises anything but our errors,
that takes longer than ``--timeout`` seconds (a hang), or that pushes the process past
``--rss-limit-mb`` (memory growth), and writes it to ``fuzz/findings/``. The seed corpus
``fuzz/corpus/`` is read, never written: new inputs go to a scratch directory. Exit status 0
means no finding; the total of executions is printed from libFuzzer's final stats.
Needs the ``fuzz`` extra (``pip install -e .[fuzz]``). Not run in CI.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
_EXECUTED = re.compile(rb"stat::number_of_executed_units:\s*(\d+)")


def _command(args: argparse.Namespace, scratch: Path, findings: Path) -> list[str]:
    command = [
        sys.executable,
        str(HERE / "fuzz_entry_points.py"),
        f"-max_total_time={args.seconds}",
        f"-timeout={args.timeout}",
        f"-rss_limit_mb={args.rss_limit_mb}",
        "-print_final_stats=1",
        f"-artifact_prefix={findings}/",
        str(scratch),
        str(HERE / "corpus"),
    ]
    if args.runs is not None:
        command.insert(2, f"-runs={args.runs}")
    return command


def _one(args: argparse.Namespace, findings: Path) -> tuple[int, int]:
    with tempfile.TemporaryDirectory(prefix="fuzz-scratch-") as scratch:
        done = subprocess.run(  # noqa: S603 - our own interpreter running our own target
            _command(args, Path(scratch), findings), capture_output=True, check=False
        )
    sys.stderr.buffer.write(done.stderr[-4000:])
    executed = sum(int(n) for n in _EXECUTED.findall(done.stderr))
    return done.returncode, executed


def main(argv: list[str] | None = None) -> int:
    """Run ``--jobs`` fuzzers side by side; 0 iff none found anything."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--seconds", type=int, required=True, help="time budget per job")
    parser.add_argument("--runs", type=int, default=None, help="stop each job after N inputs")
    parser.add_argument("--jobs", type=int, default=1, help="fuzzers run side by side")
    parser.add_argument("--timeout", type=int, default=5, help="seconds per input (a hang)")
    parser.add_argument("--rss-limit-mb", type=int, default=2048, help="memory bound")
    args = parser.parse_args(argv)
    findings = HERE / "findings"
    findings.mkdir(exist_ok=True)
    from concurrent.futures import ThreadPoolExecutor  # noqa: PLC0415 - only this entry needs it

    with ThreadPoolExecutor(args.jobs) as pool:
        results = list(pool.map(lambda _: _one(args, findings), range(args.jobs)))
    total = sum(executed for _, executed in results)
    failed = [code for code, _ in results if code != 0]
    print(f"executions: {total}; jobs: {args.jobs}; failed jobs: {len(failed)}")
    if failed:
        print(f"findings in {findings}/ (crash-*, timeout-*, oom-*)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
