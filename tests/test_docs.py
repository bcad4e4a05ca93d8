"""CPU: every `docs/numerics.md §n` citation names a section that exists, and no file cites
the TE notes that live outside the repository."""

import re
from pathlib import Path

OUTSIDE = "te_" + "semantics.md"  # split: this file must not match itself
ROOT = Path(__file__).resolve().parent.parent
SOURCES = [
    *ROOT.glob("runtime/*.py"),
    *ROOT.glob("kernels/*.py"),
    *ROOT.glob("kernels/templates/*.j2"),
    *ROOT.glob("codegen/*.py"),
    *ROOT.glob("tests/*.py"),
    ROOT / "README.md",
]


def _sections() -> set[str]:
    text = (ROOT / "docs" / "numerics.md").read_text()
    return set(re.findall(r"^#{2,3} (\d+(?:\.\d+)?)\.? ", text, flags=re.M))


def test_numerics_sections():
    sections = _sections()
    for expected in ("1", "1.1", "1.2", "1.3", "1.4", "1.5", "3.1", "3.2", "3.3", "3.4", "4"):
        assert expected in sections, expected
    assert {"5", "5.1", "5.2", "6", "9"} <= sections


def test_every_citation_resolves():
    sections = _sections()
    cited = 0
    for path in SOURCES:
        text = path.read_text()
        assert OUTSIDE not in text, f"{path} cites {OUTSIDE} (not in the repository)"
        for ref in re.findall(r"§(\d+(?:\.\d+)?)", text):
            assert ref in sections, (
                f"{path.relative_to(ROOT)} cites §{ref}, not in docs/numerics.md"
            )
            cited += 1
    assert cited >= 40
