"""docs/configuration.md is generated from the settings: it must say what the code says."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel

from reach.hub import settings_doc
from reach.hub.settings import Settings

DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def test_the_configuration_page_is_the_settings_as_they_are() -> None:
    assert DOC.read_text() == settings_doc.render(), (
        f"docs/configuration.md is stale: run `{settings_doc.COMMAND}`"
    )


def test_every_key_of_every_section_is_on_the_page() -> None:
    page = settings_doc.render()

    def keys(model: type[BaseModel], path: tuple[str, ...]) -> list[str]:
        found: list[str] = []
        for name, field in model.model_fields.items():
            sub = field.annotation
            if isinstance(sub, type) and issubclass(sub, BaseModel):
                found += keys(sub, (*path, name))
            else:
                found.append(".".join((*path, name)))
        return found

    every = keys(Settings, ())
    assert len(every) > 100
    for key in every:
        assert f"| `{key}` |" in page, key


def test_a_field_description_and_its_bounds_reach_the_page() -> None:
    page = settings_doc.render()
    assert (
        "| `router.max_queue` | `1000` | an integer, ≥ 1, ≤ 10000000 "
        "| pending + in-flight tasks per agent (429 past it) |"
    ) in page
    assert "| `probe.interval` | `5` | seconds or a duration, > 0 |" in page
    assert "| `score.rtt_good_ms` | `20` | milliseconds or a duration |" in page
    assert "| `router.read_timeout` | unset | seconds or a duration, > 0, or unset |" in page
