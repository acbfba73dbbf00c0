"""Turning a speaker's messages into an episode, facts and topics (pluggable extractors)."""
