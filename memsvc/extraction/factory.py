"""Builds the configured Extractor."""

from __future__ import annotations

from memsvc.config import Settings
from memsvc.extraction.base import Extractor
from memsvc.extraction.rules import RulesExtractor


def build_extractor(settings: Settings) -> Extractor:
    """`rules` (default, offline, deterministic) or `openai` (any chat-completions endpoint)."""
    if settings.extractor == "rules":
        return RulesExtractor()
    if settings.extractor == "openai":
        from memsvc.extraction.openai_chat import OpenAIChatExtractor

        return OpenAIChatExtractor(
            base_url=settings.openai_chat_base_url,
            model=settings.openai_chat_model,
            api_key=settings.openai_chat_api_key or None,
            timeout_s=settings.extractor_timeout_ms / 1000,
            # Whatever the model says, its facts are held to the rules' reading of the same
            # turns: polarity, subjects, what a change ends, stated times (grounding.py).
            reader=RulesExtractor(),
        )
    raise ValueError(f"unknown extractor {settings.extractor!r} (expected rules or openai)")
