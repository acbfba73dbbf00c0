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
# A thing talked about: (key, weight, display). The key (lower case) counts mentions; the
# display keeps the words' casing ("Porto", "the Alps").
Mention = tuple[str, int, str]
# The title of a conversation with nothing to name it by: a later part of the session may
# give it a better one.
UNTITLED = "Short conversation"
# Bracketed text ("[redacted card number]", the placeholder of personal data removed at
# Ingest) names nothing talked about.
_BRACKETED = re.compile(r"\[[^\[\]]*\]")


def subject_mentions(docs: Sequence[Doc]) -> list[Mention]:
    """The things talked about, in order of mention: (key, weight, display) per noun chunk
    or name, bare. Mentions of consecutive parts of a conversation concatenate (a job parsed
    in chunks)."""
    mentions: list[Mention] = []
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
            kept = [t for t in chunk if t.pos_ not in _DROP and t.dep_ != "poss"]
            kept = [t for t in kept if t.lower_ not in ("so", "such", "really", "very")]
            if not kept:
                continue
            # A common noun keeps no capital it has only for starting the sentence.
            words = [t.lower_ if t.is_sent_start and t.pos_ != "PROPN" else t.text for t in kept]
            display = " ".join(words)
            mentions.append((display.lower(), 1 + (len(words) > 1), display))
    return mentions


def _subjects(mentions: Sequence[Mention]) -> list[str]:
    """The things talked about, most mentioned first (then first mentioned), as first said."""
    counts: Counter[str] = Counter()
    first: dict[str, int] = {}
    display: dict[str, str] = {}
    for position, (key, weight, shown) in enumerate(mentions):
        counts[key] += weight
        first.setdefault(key, position)
        display.setdefault(key, shown)
    ranked = sorted(counts, key=lambda k: (-counts[k], first[k]))
    return [display[k] for k in ranked]


def _title(titles: Sequence[tuple[int, str]], subjects: Sequence[str]) -> str:
    """The headline of the most telling statement (the first of the most salient); else the
    two most talked-about things; else a plain "Short conversation"."""
    if titles:
        best = max(score for score, _ in titles)
        return next(title for score, title in titles if score == best)
    if subjects:
        text = _join(subjects[:2])
        return text[:1].upper() + text[1:]
    return UNTITLED


def _join(items: Sequence[str]) -> str:
    if len(items) <= 1:
        return "".join(items)
    return ", ".join(items[:-1]) + " and " + items[-1]


def summarize(
    turns: Sequence[Turn],
    facts: Sequence[CandidateFact],
    mentions: Sequence[Mention],
    titles: Sequence[tuple[int, str]] = (),
) -> CandidateEpisode:
    """Title: what the most telling statement was about ("Moving to Porto"), in the words'
    own casing, without the date (the episode carries its dates); summary: who talked about
    what and when, then the facts learned (events first). ``mentions``: subject_mentions of
    the turns' parses; ``titles``: (salience, headline) of the statements that gave facts."""
    when = day_text(min(t.sent_at for t in turns))
    subjects = _subjects(mentions)[:3]
    title = _title(titles, subjects)
    if subjects:
        opening = f"On {when}, the user talked about {_join(subjects)}."
    else:
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
