"""The command line (``python -m disagg_transforms``); see ``docs/cli.md``."""
