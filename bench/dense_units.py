"""What a message's vector should hold: the dense leg alone, offline, per unit choice.

    python -m bench.dense_units locomo [--limit 3] [--names]
    python -m bench.dense_units realmem [--limit 3]

The message embedder (all-MiniLM-L6-v2 int8, as the server runs it) over every turn of a
conversation (LoCoMo) or a persona (RealMem), cosine against each question; no server, no
fusion, no routing: only the unit is compared. LoCoMo: turn R@10 of the question's evidence
(a question without evidence counts as 1). RealMem: the data folder's session protocol (top
100 turns, the query's own session dropped, the first 10 distinct sessions; the share of its
gold sessions among them). Units: the turn alone; with the previous turn in front (whole, or
cut to storage.messages.PREV_CHARS as the server does); with both neighbours; with the session
date in front. The turn itself is the server's unit (storage.messages.UNIT_SQL): `{name} said,
"{text}"` where the speaker has a name (`--names` for LoCoMo; RealMem's user ids are name-like
as the server sees them, the assistant's sender id "assistant" too), else the text. The data
is read from the shared folder and never copied into the project.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import numpy as np
import numpy.typing as npt
import onnxruntime as ort

from memsvc.embedding.onnx_minilm import OnnxMiniLMEmbedder
from memsvc.storage.messages import PREV_CHARS

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


@dataclass(frozen=True)
class Turn:
    id: str
    session: str
    unit: str
    day: datetime


@dataclass(frozen=True)
class Question:
    text: str
    gold: frozenset[str]  # evidence turn ids (LoCoMo) or gold sessions (RealMem)
    session: str = ""  # RealMem: the session the query is asked in


def said(name: str | None, text: str) -> str:
    return text if not name else f'{name} said, "{text}"'


def locomo(folder: Path, names: bool) -> list[tuple[list[Turn], list[Question]]]:
    out = []
    for sample in json.loads((folder / "locomo-dev.json").read_text()):
        conversation = sample["conversation"]
        turns = []
        n = 1
        while f"session_{n}" in conversation:
            raw = conversation[f"session_{n}_date_time"].strip()
            day = datetime.strptime(raw, "%I:%M %p on %d %B, %Y")
            for t in conversation[f"session_{n}"]:
                text = t["text"]
                if t.get("blip_caption"):
                    text += f" and shared {t['blip_caption']}"
                turns.append(
                    Turn(t["dia_id"], str(n), said(t["speaker"] if names else None, text), day)
                )
            n += 1
        questions = [
            Question(q["question"], frozenset(q.get("evidence") or ())) for q in sample["qa"]
        ]
        out.append((turns, questions))
    return out


def realmem(folder: Path, names: bool) -> list[tuple[list[Turn], list[Question]]]:
    out = []
    for persona in json.loads((folder / "realmem-dev.json").read_text()):
        user = "realmem-" + re.sub(r"[^A-Za-z0-9]", "-", persona["persona"])
        turns = []
        for session in persona["sessions"]:
            day = datetime.strptime(session["time"], "%Y-%m-%d")
            for t in session["turns"]:
                text = _CONTROL.sub("", t["text"])[:8_000]
                if text.strip():
                    who = user if t["role"] == "USER" else "assistant"
                    turns.append(Turn(t["id"], session["sid"], said(who, text), day))
        questions = [
            Question(q["text"], frozenset(q["gold"]), q["session"]) for q in persona["queries"]
        ]
        out.append((turns, questions))
    return out


def variants(turns: list[Turn]) -> dict[str, list[str]]:
    prev = [
        turns[i - 1].unit if i > 0 and turns[i - 1].session == t.session else None
        for i, t in enumerate(turns)
    ]
    after = [
        turns[i + 1].unit if i + 1 < len(turns) and turns[i + 1].session == t.session else None
        for i, t in enumerate(turns)
    ]

    def join(*parts: str | None) -> str:
        return "\n".join(p for p in parts if p is not None)

    return {
        "turn alone": [t.unit for t in turns],
        "previous + turn": [join(p, t.unit) for t, p in zip(turns, prev, strict=True)],
        f"previous[-{PREV_CHARS}:] + turn": [
            join(p[-PREV_CHARS:] if p else None, t.unit) for t, p in zip(turns, prev, strict=True)
        ],
        "previous + turn + next": [
            join(p, t.unit, n) for t, p, n in zip(turns, prev, after, strict=True)
        ],
        "date: previous + turn": [
            t.day.strftime("%-d %B %Y: ") + join(p, t.unit)
            for t, p in zip(turns, prev, strict=True)
        ],
    }


def turn_recall(turns: list[Turn], q: Question, order: npt.NDArray[np.intp]) -> float:
    if not q.gold:
        return 1.0
    return len(q.gold & {turns[j].id for j in order[:10]}) / len(q.gold)


def session_recall(turns: list[Turn], q: Question, order: npt.NDArray[np.intp]) -> float:
    seen: list[str] = []
    for j in order[:100]:
        s = turns[j].session
        if s != q.session and s not in seen:
            seen.append(s)
            if len(seen) == 10:
                break
    return len(q.gold & set(seen)) / len(q.gold) if q.gold else 1.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("set", choices=("locomo", "realmem"))
    parser.add_argument("--data", type=Path, default=None, help="the shared data folder")
    parser.add_argument("--limit", type=int, default=0, help="only the first N (0: all)")
    parser.add_argument("--names", action="store_true", help="LoCoMo: speakers' names")
    args = parser.parse_args()
    folder = args.data or Path("..") / "shared" / "data" / args.set
    load = locomo if args.set == "locomo" else realmem
    score: Callable[[list[Turn], Question, npt.NDArray[np.intp]], float] = (
        turn_recall if args.set == "locomo" else session_recall
    )
    embedder = OnnxMiniLMEmbedder()

    def embed(texts: list[str]) -> npt.NDArray[np.float32]:
        return embedder._embed_blocking(texts, ort.RunOptions())

    items = load(folder, args.names)
    if args.limit:
        items = items[: args.limit]
    recalls: dict[str, list[float]] = {}
    for turns, questions in items:
        query = embed([q.text for q in questions])
        for name, units in variants(turns).items():
            similarity = query @ embed(units).T
            for q, row in zip(questions, similarity, strict=True):
                recalls.setdefault(name, []).append(score(turns, q, np.argsort(-row)))
        print({k: round(100 * float(np.mean(v)), 1) for k, v in recalls.items()}, flush=True)
    for name, values in recalls.items():
        print(f"{args.set} {name:<28} R@10 {100 * np.mean(values):5.1f}  ({len(values)} questions)")


if __name__ == "__main__":
    main()
