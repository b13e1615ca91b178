"""The exchange: one client request through its worker calls and back, without I/O.

Sits above ``_request`` and ``_response`` (it composes both; neither imports it). ``events`` is
what it asks of the router, ``flow`` the state machine that asks it, ``reply`` the one place that
calls the response envelopes, ``check`` the pipeline's startup warnings. See
``docs/exchange.md``.
"""
