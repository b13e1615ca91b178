"""``python -m disagg_transforms``: the command line (see ``docs/cli.md``)."""

from __future__ import annotations

from disagg_transforms._cli.main import main

if __name__ == "__main__":
    raise SystemExit(main())
