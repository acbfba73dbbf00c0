"""Recall: concurrent dense and lexical legs under the call's deadline, fused by RRF."""
