"""Turning a speaker's messages into an episode, facts and topics.

The Extractor protocol (base.py) and its implementations; the write path's pipeline calls them.
"""
