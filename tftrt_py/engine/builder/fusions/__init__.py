"""Layer fusions: (pattern, rewrite) rules grouped by root layer kind, one module per family.

Each module exposes plain passes ``pass_(network) -> bool``; the builder's PIPELINE orders them.
"""
