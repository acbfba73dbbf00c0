"""The read path's Recall.

Concurrent dense and lexical legs under the call's deadline, fused by RRF; and the recorder of
what reads returned.
"""
