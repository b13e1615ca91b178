"""The exchange: one client request through its worker calls and back, without I/O.

Sits above ``_request`` and ``_response`` (it composes both; neither imports it). ``flow`` is
the state machine, ``reply`` the one place that calls the response envelopes, ``failure`` the
one place that writes error bodies. See ``docs/exchange.md``.
"""
