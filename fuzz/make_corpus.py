"""Write the seed corpus ``fuzz/corpus/`` from the golden fixtures in ``tests/fixtures/``.

Each seed is one target's index byte followed by a fixture's bytes (a stream for the stream
targets, a JSON body for the others), plus a few hostile seeds. Rerun after adding a target.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from fuzz_entry_points import TARGETS

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
CORPUS = ROOT / "fuzz" / "corpus"
MAX_SEED_BYTES = 4096  # keep the corpus small: a fuzzer grows big inputs itself
# The last seeds put a byte that is not UTF-8 inside a member a wrap decodes (a worker's
# usage, a client's tool list): refused by our error naming the member, never msgspec's.
HOSTILE = (
    b"",
    b"{",
    b"[" * 300,
    b'{"output_mode": NaN}',
    b'{"a": "\\ud800", "a": 1}',
    b"\xff",
    b'{"usage": {"prompt_tokens": "\xff"}, "choices": [{"text": "a", "index": 0}]}',
    b'{"messages": [{"role": "user", "content": "\xc3("}], "tools": [{"a": "\xff"}]}',
)


def seeds() -> dict[str, bytes]:
    """Seed name -> bytes, for every target and every fixture of its kind."""
    out: dict[str, bytes] = {}
    for index, (name, _) in enumerate(TARGETS):
        streams = "Stream" in name or name == "SseParser"
        suffix = ".sse" if streams else ".json"
        for fixture in sorted(FIXTURES.glob(f"*{suffix}")):
            if fixture.stat().st_size > MAX_SEED_BYTES:
                continue
            out[f"{index:02d}-{fixture.stem}"] = (
                bytes([index]) + b"\x00" * streams + (fixture.read_bytes())
            )
        for raw in HOSTILE:
            digest = hashlib.sha1(raw).hexdigest()[:8]  # noqa: S324 - a file name, not security
            out[f"{index:02d}-hostile-{digest}"] = bytes([index]) + raw
    return out


def main() -> None:
    """Replace the corpus with the current seeds."""
    CORPUS.mkdir(exist_ok=True)
    for old in CORPUS.iterdir():
        old.unlink()
    for name, data in seeds().items():
        (CORPUS / name).write_bytes(data)


if __name__ == "__main__":
    main()
