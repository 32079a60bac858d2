"""Key material the pipeline's processes prove themselves with: stage signing keys and TLS certificates.

It has a room of its own because it serves a real deployment (``tjpipe keys``, ``tjpipe credentials``) as
much as the local stack, so it must not live in ``tjpipe.local``, which only the developer stack needs.
"""
