"""The request side: the bodies of the legs a router sends to workers.

``legs`` builds the encode, prefill and decode legs; ``caps`` moves the client's output cap;
``mapping`` is the contract between a client API's mapper and the leg builder; ``fields`` holds
the rules every mapper shares; ``chat``, ``completions``, ``responses`` and ``messages`` map one
client API each. Never imports the response side (see ``docs/architecture.md``).
"""
