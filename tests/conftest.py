"""Hypothesis profiles for the whole suite, chosen by ``HYPOTHESIS_PROFILE`` (default ``dev``)."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

# "dev" keeps the local loop quick; "ci" runs more examples, derandomized so that a green run on
# a machine is green in CI too (the examples are a fixed function of the test); "fuzz" is random
# and long, for runs by hand. "wheel" is "ci" with fewer examples, for CI's second run of the
# suite, against the built wheel: the "ci" run has just held the same code to its 400, so this
# one looks for a file the wheel lacks (every property still runs), not for new examples.
settings.register_profile("dev", max_examples=60, deadline=None)
settings.register_profile(
    "ci",
    max_examples=400,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("wheel", settings.get_profile("ci"), max_examples=25)
settings.register_profile(
    "fuzz", max_examples=20_000, deadline=None, suppress_health_check=list(HealthCheck)
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))
