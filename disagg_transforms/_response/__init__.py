"""The response side: a worker's answer turned back into the envelope the client asked for.

``options`` holds how every envelope is built; ``echo`` checks the ``output_mode`` echo;
``turn`` reads one assistant turn out of a generate answer; ``choices`` holds the per-choice
rules; ``chat``, ``responses`` and ``messages`` build one client API's envelope each (wrap,
single frame and stream converter); ``generate_stream`` reads a generate SSE stream;
``dispatch`` picks the envelope of a client's route. Never imports the request side (see
``docs/architecture.md``).
"""
