"""An episode's title and summary: what the user talked about, when, in sentences."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence

from spacy.tokens import Doc

from memsvc.extraction.base import CandidateEpisode, CandidateFact, Turn
from memsvc.extraction.dates import day_text

# Noun heads that name nothing a person would look an episode up by.
_VAGUE = frozenset(
    {"thing", "things", "lot", "time", "way", "bit", "stuff", "kind", "sort", "one", "day"}
    | {"idea", "point", "question", "thanks", "today", "everything", "something", "anything"}
    | {"nothing", "people", "guy", "guys", "fun", "sure", "part", "lol", "haha", "wow", "hey"}
)
_DROP = frozenset({"DET", "PRON", "PUNCT", "SPACE", "CCONJ", "ADP"})
_MAX_SUMMARY_FACTS = 6
# Bracketed text ("[redacted card number]", the placeholder of personal data removed at
# Ingest) names nothing talked about.
_BRACKETED = re.compile(r"\[[^\[\]]*\]")


def subject_mentions(docs: Sequence[Doc]) -> list[tuple[str, int]]:
    """The things talked about, in order of mention: (key, weight) per noun chunk or name,
    bare. Mentions of consecutive parts of a conversation concatenate (a job parsed in
    chunks)."""
    mentions: list[tuple[str, int]] = []
    for doc in docs:
        brackets = [m.span() for m in _BRACKETED.finditer(doc.text)]
        for chunk in doc.noun_chunks:
            if chunk.root.pos_ in ("PRON", "NUM") or chunk.root.lemma_.lower() in _VAGUE:
                continue
            start, end = chunk.start_char, chunk.end_char
            if any(start < b_end and end > b_start for b_start, b_end in brackets):
                continue
            if chunk.root.ent_type_ in ("DATE", "TIME", "CARDINAL", "ORDINAL", "PERSON"):
                continue
            words = [t.text for t in chunk if t.pos_ not in _DROP and t.dep_ != "poss"]
            words = [w for w in words if w.lower() not in ("so", "such", "really", "very")]
            if not words:
                continue
            mentions.append((" ".join(words).lower(), 1 + (len(words) > 1)))
    return mentions


def _subjects(mentions: Sequence[tuple[str, int]]) -> list[str]:
    """The things talked about, most mentioned first (then first mentioned)."""
    counts: Counter[str] = Counter()
    first: dict[str, int] = {}
    for position, (key, weight) in enumerate(mentions):
        counts[key] += weight
        first.setdefault(key, position)
    ranked = sorted(counts, key=lambda k: (-counts[k], first[k]))
    return ranked


def _join(items: Sequence[str]) -> str:
    if len(items) <= 1:
        return "".join(items)
    return ", ".join(items[:-1]) + " and " + items[-1]


def summarize(
    turns: Sequence[Turn],
    facts: Sequence[CandidateFact],
    mentions: Sequence[tuple[str, int]],
) -> CandidateEpisode:
    """Title: the two most talked-about things and the date; summary: who talked about what
    and when, then the facts learned (events first). ``mentions``: subject_mentions of the
    turns' parses."""
    when = day_text(min(t.sent_at for t in turns))
    subjects = _subjects(mentions)[:3]
    if subjects:
        title = f"The user on {_join(subjects[:2])}, {when}"
        opening = f"On {when}, the user talked about {_join(subjects)}."
    else:
        title = f"Conversation with the user, {when}"
        opening = f"On {when}, the user had a short conversation."
    ordered = sorted(facts, key=lambda f: (f.category != "event", f.predicate != ""))
    told = " ".join(f.content for f in ordered[:_MAX_SUMMARY_FACTS])
    summary = f"{opening} {told}".strip()
    first = next((t for t in turns if t.text.strip()), turns[0])
    excerpt = first.text.strip()
    if len(excerpt) > 200:
        excerpt = excerpt[:199].rstrip() + "…"
    return CandidateEpisode(
        title=title[:120],
        summary=summary[:1_000],
        excerpt=excerpt,
        source_message_ids=tuple(t.message_id for t in turns),
    )
