"""Every Mulan dataset loads (issue 32, item 5): quoted attribute names, nominal and string attributes,
sparse rows with nominals, missing values and corrupt rows, on small synthetic ARFF + XML fixtures; then
the real datasets of the package's data cache (skipped, saying where, when the cache lacks them)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch

from structtorch.data import load_arff, load_mulan

XML_HEAD = '<?xml version="1.0" encoding="utf-8"?>\n<labels xmlns="http://mulan.sourceforge.net/labels">\n'


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def _dataset(root: Path, name: str, header: str, train: str, test: str | None, xml_labels: str) -> Path:
    """<root>/<name>/<name>-train.arff (+ -test.arff) and <name>.xml; header ends with '@data'."""
    _write(root / name / f"{name}-train.arff", header + "\n" + train)
    if test is not None:
        _write(root / name / f"{name}-test.arff", header + "\n" + test)
    _write(root / name / f"{name}.xml", XML_HEAD + xml_labels + "</labels>\n")
    return root


# ---------------------------------------------------------------------- quoted names (birds)
BIRDS_HEADER = r"""@relation birds
@attribute 'audio feature' numeric
@attribute 'a\\b \%50' numeric
@attribute 'Brown Creeper' {0,1}
@attribute 'Swainson\'s Thrush' {0,1}
@attribute "Hammond's \"Flycatcher\"" {0,1}
@attribute	'MacGillivray\'s Warbler'	{0,1}
@attribute Stellar\'s {0,1}
@data"""
BIRDS_XML = """<label name="Brown Creeper"></label>
<label name="Swainson&apos;s Thrush"></label>
<label name='Hammond&apos;s &quot;Flycatcher&quot;'/>
<label name="MacGillivray&#39;s Warbler"/>
<label name="Stellar\\'s"/>
"""
BIRDS_LABELS = ["Brown Creeper", "Swainson's Thrush", 'Hammond\'s "Flycatcher"', "MacGillivray's Warbler",
                "Stellar\\'s"]


def test_quoted_attribute_names_are_unquoted_and_unescaped(tmp_path: Path) -> None:
    path = _write(tmp_path / "b.arff", BIRDS_HEADER + "\n1.5,2,0,1,1,0,1\n")
    assert load_arff(path).names == ["audio feature", "a\\b %50", *BIRDS_LABELS]


def test_birds_style_label_names_match_the_xml(tmp_path: Path) -> None:
    root = _dataset(tmp_path, "quoted", BIRDS_HEADER, "1.5,2,0,1,1,0,1\n0.5,3,1,0,0,1,0\n",
                    "2,2,1,1,1,1,1\n", BIRDS_XML)
    x, y, feats, labels = load_mulan("quoted", "train", root=root)
    assert labels == BIRDS_LABELS and feats == ["audio feature", "a\\b %50"]
    np.testing.assert_array_equal(y.numpy(), [[0, 1, 1, 0, 1], [1, 0, 0, 1, 0]])
    assert torch.equal(x, torch.tensor([[1.5, 2.0], [0.5, 3.0]]))


@pytest.mark.parametrize("line, what", [
    ("@attribute 'unterminated {0,1}", "unterminated"),
    ("@attribute 'f0' numeric", "declared twice"),
])
def test_bad_attribute_names_name_file_and_line(tmp_path: Path, line: str, what: str) -> None:
    path = _write(tmp_path / "n.arff", f"@relation r\n@attribute f0 numeric\n{line}\n@data\n1,1\n")
    with pytest.raises(ValueError, match=rf"n\.arff, line 3: .*{what}"):
        load_arff(path)


# ---------------------------------------------------------------------- corrupt rows
MISSING_HEADER = """@relation m
@attribute f numeric
@attribute c {a,b,c}
@attribute w {0,1}
@attribute y0 {0,1}
@data"""


@pytest.mark.parametrize("row", [
    ",".join(["0.123456789"] * 60),  # too many values, 700 characters
    "1," + "z" * 600 + ",1,1",  # an undeclared nominal value
    "{0 1, 9 " + "1" * 600 + "}",  # a sparse index out of range
], ids=["too-many-values", "undeclared-nominal", "sparse-index"])
def test_corrupt_row_error_is_short(tmp_path: Path, row: str) -> None:
    path = _write(tmp_path / "bad.arff", MISSING_HEADER + "\n1,a,1,1\n" + row + "\n")
    with pytest.raises(ValueError, match=r"bad\.arff, line 8: ") as err:
        load_arff(path)
    msg = str(err.value)
    assert re.search(r"\.\.\. \(\d{3} characters\)", msg) and row[:81] not in msg and len(msg) < len(str(path)) + 300


