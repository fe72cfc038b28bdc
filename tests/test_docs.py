"""The docs' layout names every module of the package, in its layer's section (a source check)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "jaxqueue"
LAYOUT = ROOT / "docs" / "layout.md"


def _sections(text: str) -> dict[str, str]:
    parts = re.split(r"^## ", text, flags=re.MULTILINE)
    return {part.split("\n", 1)[0].split()[0]: part for part in parts[1:]}


def test_every_module_appears_in_the_layout():
    text = LAYOUT.read_text(encoding="utf-8")
    sections = _sections(text)
    missing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        if len(rel.parts) == 1:  # api.py, __init__.py, __main__.py: the layer table
            if f"`{rel.name}`" not in text:
                missing.append(str(rel))
            continue
        layer = f"{rel.parts[0]}/"
        if rel.name == "__init__.py" and layer != "cli/":
            continue  # a package's own file: its section is the package
        # in a layer's sub-package, named with its folder (`generic/meanfield.py`)
        name = "/".join(rel.parts[1:])
        if f"`{name}`" not in sections.get(layer, ""):
            missing.append(str(rel))
    assert not missing, f"name these in docs/layout.md under their layer: {missing}"
