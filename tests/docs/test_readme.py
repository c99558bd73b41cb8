"""README is a landing page (at most 300 lines, the two set-up commands), and every relative link of
README and docs/ leads to a file of the checkout."""
from __future__ import annotations

import os
import re

import pytest

from tests.docs.examples import TOP, all_blocks, pages

pytestmark = pytest.mark.timeout(30)
MAX_README_LINES = 300
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _read(rel: str) -> str:
    with open(os.path.join(TOP, rel), encoding="utf-8") as f:
        return f.read()


def test_readme_is_a_landing_page_of_at_most_300_lines():
    n = len(_read("README.md").splitlines())
    assert n <= MAX_README_LINES, (f"README.md has {n} lines; the landing page holds at most {MAX_README_LINES}: "
                                   "move the detail to docs/ and link it")


def test_readme_gives_exactly_the_two_set_up_commands():
    setup = [b for b in all_blocks() if b.path == "README.md" and "tools/run.sh" in b.code]
    assert len(setup) == 1
    commands = [line.split("#")[0].strip() for line in setup[0].code.splitlines() if line.strip()]
    assert commands == ["tools/run.sh", "tools/test.sh"]
    for script in commands:
        assert os.access(os.path.join(TOP, script), os.X_OK), script


@pytest.mark.parametrize("rel", pages() + ["CHANGELOG.md"])
def test_relative_links_resolve(rel):
    text = re.sub(r"```.*?```", "", _read(rel), flags=re.S)         # code is not linked
    base = os.path.dirname(os.path.join(TOP, rel))
    broken = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            continue
        path = target.split("#")[0]
        if path and not os.path.exists(os.path.normpath(os.path.join(base, path))):
            broken.append(target)
    assert not broken, f"{rel} links to missing files: {broken}"
