"""``router.semantic_model``: which folders a hub can run, judged from their files alone
(no torch), and a folder that is none stops start-up naming the setting."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reach.errors import ConfigError
from reach.hub.fleet.embeddings.backend import availability, folder_problem
from reach.hub.settings import load_settings

MEAN = {"word_embedding_dimension": 512, "pooling_mode_mean_tokens": True}
MODULES = [
    {"type": "sentence_transformers.models.Transformer"},
    {"type": "sentence_transformers.models.Pooling"},
    {"type": "sentence_transformers.models.Normalize"},
]


def model_folder(tmp_path: Path, *, pooling: object = MEAN, modules: object = MODULES) -> Path:
    folder = tmp_path / "bge-small-zh-v1.5"
    (folder / "1_Pooling").mkdir(parents=True)
    (folder / "config.json").write_text('{"hidden_size": 512}')
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    (folder / "modules.json").write_text(json.dumps(modules))
    return folder


def test_a_mean_pooled_model_folder_is_runnable(tmp_path: Path) -> None:
    assert folder_problem(str(model_folder(tmp_path))) is None


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"pooling": {"word_embedding_dimension": 512, "pooling_mode_cls_token": True}}, "mean"),
        ({"pooling": {"pooling_mode_mean_tokens": True}}, "word_embedding_dimension"),
        (
            {"modules": [*MODULES, {"type": "sentence_transformers.models.Dense"}]},
            "does not run: sentence_transformers.models.Dense",
        ),
    ],
)
def test_folders_it_cannot_run(tmp_path: Path, change: dict[str, object], words: str) -> None:
    problem = folder_problem(str(model_folder(tmp_path, **change)))  # type: ignore[arg-type]
    assert problem is not None and words in problem


def test_no_folder_or_no_model_in_it(tmp_path: Path) -> None:
    assert "no model folder at" in str(folder_problem(str(tmp_path / "nowhere")))
    (tmp_path / "empty").mkdir()
    assert "no config.json" in str(folder_problem(str(tmp_path / "empty")))


@pytest.mark.parametrize("mode", ["auto", "on"])
def test_start_up_refuses_a_folder_that_is_no_model(tmp_path: Path, mode: str) -> None:
    settings = load_settings(
        environ={
            "REACH_ROUTER__SEMANTIC": mode,
            "REACH_ROUTER__SEMANTIC_MODEL": str(tmp_path / "nowhere"),
        }
    )
    with pytest.raises(ConfigError, match=r"invalid setting router\.semantic_model: no model"):
        availability(settings.router.semantic, settings.router.semantic_model)


def test_semantic_off_ignores_the_model(tmp_path: Path) -> None:
    assert not availability("off", str(tmp_path / "nowhere")).on
