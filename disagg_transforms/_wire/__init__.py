"""The wire layer: JSON bytes and keys, below both sides and knowing none of their rules.

``keys`` spells every wire key; ``raw`` splits a body into its top-level members for the bytes
fast path; ``json_copy`` deep-copies JSON containers; ``sse`` frames and parses server-sent
events; ``limits`` bounds what a body may hold; ``validate`` holds the typed readers;
``describe`` writes short descriptions of values for error messages. Nothing here imports the
request side, the response side or the configuration (see ``docs/architecture.md``).
"""
