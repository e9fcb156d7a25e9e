"""Talking to an OpenAI-compatible server: the one streaming client (`client`), its SSE and
chunked-body decoding (`sse`), the request record every request of the suite becomes (`request`)
and the KV-block prefix hashes of a request's token ids (`prefixhash`).

It imports nothing of the suite but `common`, so every stage can use it: the arms, the
compressors, the background users, the self-check and the probes all send through it.
"""
