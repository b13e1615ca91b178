"""Adapters for host frameworks: optional extras, never imported by the core.

- :mod:`disagg_transforms.integrations.litellm`: a LiteLLM custom provider serving chat
  completions from a vLLM worker's generate route, and LiteLLM callbacks (``pip install
  'disagg_transforms[litellm]'``).

Unlike the core, an integration does I/O (the LiteLLM provider speaks HTTP to the worker).
"""

from __future__ import annotations

__all__ = ()
