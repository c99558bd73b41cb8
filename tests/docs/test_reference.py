"""docs/cli.md and docs/config.md are what ``hostmq.reference`` renders from the parsers and the config
dataclasses: a changed option or key without the regenerated page fails here."""
from __future__ import annotations

import os

import pytest

from hostmq import reference
from tests.docs.examples import TOP

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("name", sorted(reference.PAGES))
def test_reference_page_matches_the_code(name):
    with open(os.path.join(TOP, "docs", name), encoding="utf-8") as f:
        committed = f.read()
    assert committed == reference.PAGES[name](), (
        f"docs/{name} is out of date: run `python -m hostmq.reference docs` and commit the result")


def test_every_config_key_has_a_meaning():
    text = reference.config_markdown()
    rows = [line for line in text.splitlines() if line.startswith("| `") and line.count("|") == 5]
    assert len(rows) > 50
    blank = [r.split("|")[1].strip() for r in rows if not r.split("|")[4].strip()]
    assert len(blank) <= 10, f"config keys without a comment in hostmq/config.py: {blank}"


def test_every_command_is_documented_once():
    heads = [line for line in reference.cli_markdown().splitlines() if line.startswith("## `hostmq")]
    assert len(heads) == len(set(heads)) > 20, sorted(h for h in heads if heads.count(h) > 1)
    assert "## `hostmq topic create`" in heads and "## `hostmq bench`" in heads
