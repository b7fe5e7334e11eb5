"""Reading Weka ARFF files (dense and sparse) into numpy arrays, with errors that name file and line.

Parsing is done by liac-arff. Dense files are decoded row by row; files whose data rows are
all sparse (``{index value, ...}``) are decoded in liac-arff's COO mode, so no Python object
per zero entry is ever built. Every liac-arff error is re-raised as a ``ValueError`` of the form
``"<path>, line <k>: <what went wrong>"``; a row or value quoted in it is cut to about 80 characters.

Attribute names are decoded here, not by liac-arff (which keeps the backslashes of a quoted name):
a name is a run of non-blank characters, or is quoted with ``'...'`` or ``"..."``, inside which a
backslash escapes the next character (``\\'``, ``\\"``, ``\\\\``, ``\\%``, ``\\t``, ``\\n``, ...,
``\\uXXXX``, octal ``\\ooo``), as Weka writes and reads them.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, replace

import arff as liac_arff
import numpy as np

__all__ = ["ArffAttribute", "ArffData", "load_arff"]

#: columns of values that ``ArffData.split`` reorders at a time (its one temporary: N x this many values)
REORDER_COLUMNS = 256
_DATA_RE = re.compile(r"^@data\b", re.IGNORECASE)
_ATTRIBUTE_RE = re.compile(r"^@attribute(?=\s|$)", re.IGNORECASE)
_QUOTED_NAME_RE = re.compile(r"'((?:[^'\\]|\\.)*)'" r'|"((?:[^"\\]|\\.)*)"', re.DOTALL)
_ESCAPE_RE = re.compile(r"\\(u[0-9a-fA-F]{4}|[0-7]{1,3}|.)", re.DOTALL)
_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v"}
_SHOWN = 80  # at most this many characters of a row or value from the file in an error message
_HINTS = {
    "BadDataFormat": "wrong number of values in a dense row, or a sparse index out of range",
    "BadNumericalValue": "a numeric attribute got a value that is not a number",
    "BadNominalValue": "a nominal attribute got a value not in its declaration",
    "BadAttributeType": "supported types: NUMERIC, REAL, INTEGER, STRING, nominal {...}",
}
# liac-arff messages that quote a row or a value of the file: (before it)(it)(after it)
_QUOTES_FILE_TEXT = {
    "BadDataFormat": re.compile(r"^(Bad @DATA instance format: )(.*)()$", re.DOTALL),
    "BadNominalValue": re.compile(r"^(Data value )(.*)( not found in nominal declaration)$", re.DOTALL),
    "BadNominalFormatting": re.compile(r'^(Nominal data value ")(.*)(" not properly quoted)$', re.DOTALL),
}


@dataclass(frozen=True)
class ArffAttribute:
    """One ``@attribute`` declaration.

    kind: ``"numeric"`` (NUMERIC / REAL / INTEGER), ``"nominal"`` or ``"string"``.
    values: the declared nominal values, in order (empty for other kinds).
    """

    name: str
    kind: str
    values: tuple[str, ...] = ()

    @property
    def declaration(self) -> str:
        """The type as declared: ``numeric``, ``string`` or ``{v1,v2,...}``."""
        return "{" + ",".join(self.values) + "}" if self.kind == "nominal" else self.kind

    @property
    def is_binary_nominal(self) -> bool:
        """A nominal attribute declared over (a subset of) ``{0, 1}``: the Mulan label type."""
        return self.kind == "nominal" and 0 < len(self.values) <= 2 and set(self.values) <= {"0", "1"}


@dataclass
class ArffData:
    """A parsed ARFF file.

    values: float64 [N, A]. Numeric attributes hold their value, nominal attributes the index of
        the value in ``attributes[j].values``; missing values (``?``) and string attributes are NaN.
        Sparse rows: omitted entries are 0 (numeric) / the first declared value (nominal).
    strings: raw values of the string attributes, by attribute name (lists of length N,
        None where missing).
    lines: int64 [N], the 1-based line number of every data row in the file.
    sparse: True when the data rows are in sparse ``{index value, ...}`` form.
    """

    path: str
    relation: str
    attributes: list[ArffAttribute]
    values: np.ndarray
    lines: np.ndarray
    sparse: bool
    strings: dict[str, list[str | None]] = field(default_factory=dict)

    @property
    def num_rows(self) -> int:
        return int(self.values.shape[0])

    @property
    def names(self) -> list[str]:
        return [a.name for a in self.attributes]

    def subset(self, rows: np.ndarray) -> ArffData:
        """The data rows ``rows`` (int64 [M], indices into the N rows) of this file, in that order."""
        strings = {name: [col[i] for i in rows] for name, col in self.strings.items()}
        return replace(self, values=self.values[rows], lines=self.lines[rows], strings=strings)

    def split(self, first: np.ndarray, second: np.ndarray) -> tuple[ArffData, ArffData]:
        """``subset(first)``, ``subset(second)`` of a partition of the rows (int64 [M], [N - M]), without a copy of
        the values: this file's rows are put in that order in place (``REORDER_COLUMNS`` columns of values at a
        time) and each part's values are a view of them."""
        order = np.concatenate([first, second])
        if not np.array_equal(np.sort(order), np.arange(self.num_rows)):
            raise ValueError(f"ArffData.split: the two index arrays must hold each of the {self.num_rows} rows once")
        for start in range(0, self.values.shape[1], REORDER_COLUMNS):
            block = self.values[:, start:start + REORDER_COLUMNS]
            block[:] = block[order]  # the right side is a copy of the block: safe in place
        self.lines = self.lines[order]
        self.strings = {name: [col[i] for i in order] for name, col in self.strings.items()}
        m = len(first)
        return tuple(replace(self, values=self.values[part], lines=self.lines[part],
                             strings={name: col[part] for name, col in self.strings.items()})
                     for part in (slice(0, m), slice(m, None)))

    def nominal_value(self, column: int) -> np.ndarray:
        """The declared nominal value (str, None where missing) of every row of ``column``: [N]."""
        attr = self.attributes[column]
        if attr.kind != "nominal":
            raise ValueError(f"attribute {attr.name!r} is {attr.kind}, not nominal")
        table = np.array([*attr.values, None], dtype=object)
        idx = self.values[:, column]
        return table[np.where(np.isnan(idx), len(attr.values), idx).astype(np.int64)]


def load_arff(path: str | os.PathLike) -> ArffData:
    """Parse a dense or sparse ARFF file.

    Raises FileNotFoundError if ``path`` does not exist, and ValueError naming the file and the
    line number for a malformed file (bad value, wrong number of columns, missing ``@data``,
    bad ``@attribute`` line, unsupported attribute type such as DATE, ...).
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"ARFF file not found: {os.path.abspath(path)}")
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = f.read().split("\n")
    data_at = _data_section_start(lines, path)
    row_lines = _data_row_lines(lines, data_at)
    sparse = bool(row_lines.size) and lines[row_lines[0] - 1].lstrip().startswith("{")
    names = _take_attribute_names(lines, data_at, path)
    obj = _decode(lines, path, sparse)
    attributes = [_attribute(name, kind) for name, (_, kind) in zip(names, obj["attributes"])]
    if sparse and isinstance(obj["data"], tuple):
        values, strings = _from_coo(obj["data"], attributes, len(row_lines))
    else:
        values, strings = _from_dense(obj["data"], attributes, row_lines, path)
    return ArffData(path, obj["relation"], attributes, values, row_lines, sparse, strings)


# ---------------------------------------------------------------------- parsing helpers
def _data_section_start(lines: list[str], path: str) -> int:
    """0-based index of the ``@data`` line; ValueError if there is none."""
    for i, line in enumerate(lines):
        if _DATA_RE.match(line.strip()):
            return i
    last = max(1, len(lines) - (lines[-1] == ""))
    raise ValueError(f"{path}, line {last}: malformed ARFF file: no '@data' line found before the end "
                     f"of the file (expected '@relation', '@attribute' lines, then '@data' and the rows)")


def _data_row_lines(lines: list[str], data_at: int) -> np.ndarray:
    """1-based line numbers of the data rows (non-empty, non-comment lines after ``@data``)."""
    rows = [i + 1 for i in range(data_at + 1, len(lines))
            if lines[i].strip() and not lines[i].strip().startswith("%")]
    return np.asarray(rows, dtype=np.int64)


def _take_attribute_names(lines: list[str], data_at: int, path: str) -> list[str]:
    """Decode the name of every ``@attribute`` line before ``@data`` and put a plain placeholder name
    (``a<j>``) in its place in ``lines``, so liac-arff only parses the types. ValueError naming the line
    for an unterminated quoted name or a name declared twice."""
    names: list[str] = []
    first_line: dict[str, int] = {}
    for i in range(data_at):
        line = lines[i].strip()
        if not _ATTRIBUTE_RE.match(line):
            continue
        name, rest = _split_attribute_name(line[len("@attribute"):].lstrip(), path, i + 1)
        if name in first_line:
            raise ValueError(f"{path}, line {i + 1}: malformed ARFF file: attribute name {_clip(name)!r} is "
                             f"declared twice (first on line {first_line[name]})")
        first_line[name] = i + 1
        lines[i] = f"@attribute a{len(names)} {rest.strip()}"
        names.append(name)
    return names


def _split_attribute_name(text: str, path: str, line: int) -> tuple[str, str]:
    """(decoded name, the rest: the type) of the text after ``@attribute``."""
    if not text:
        raise ValueError(f"{path}, line {line}: malformed ARFF file: '@attribute' without a name and a type")
    if text[0] not in ("'", '"'):
        parts = text.split(None, 1)
        return parts[0], parts[1] if len(parts) > 1 else ""
    m = _QUOTED_NAME_RE.match(text)
    if m is None:
        raise ValueError(f"{path}, line {line}: malformed ARFF file: unterminated quoted attribute name in "
                         f"{_clip(text)!r} (expected {text[0]}name{text[0]}, with \\{text[0]} for a quote inside)")
    raw = m.group(1) if m.group(1) is not None else m.group(2)
    return _ESCAPE_RE.sub(_unescape, raw), text[m.end():]


def _unescape(m: re.Match) -> str:
    """One backslash escape of a quoted name: ``\\t`` etc., ``\\uXXXX``, octal, else the character itself."""
    code = m.group(1)
    if len(code) == 5 and code[0] == "u":
        return chr(int(code[1:], 16))
    if code[0] in "01234567":
        return chr(int(code, 8))
    return _ESCAPES.get(code, code)


def _clip(text: str) -> str:
    """``text`` cut to about ``_SHOWN`` characters for an error message."""
    return text if len(text) <= _SHOWN else f"{text[:_SHOWN - 3]}... ({len(text)} characters)"


def _decode(lines: list[str], path: str, sparse: bool) -> dict:
    """liac-arff decode; COO for sparse files (falls back to dense rows for mixed files)."""
    modes = (liac_arff.COO, liac_arff.DENSE) if sparse else (liac_arff.DENSE,)
    for k, mode in enumerate(modes):
        decoder = liac_arff.ArffDecoder()
        try:
            return decoder.decode(iter(lines), encode_nominal=True, return_type=mode)
        except liac_arff.BadLayout:
            if k + 1 < len(modes):
                continue  # a dense row inside a sparse file: COO refuses it, dense mode does not
            raise _located(path, decoder, "malformed ARFF file (invalid layout)") from None
        except liac_arff.ArffException as err:
            raise _located(path, decoder, _describe(err)) from None
        except (ValueError, KeyError, IndexError, TypeError, OverflowError) as err:
            raise _located(path, decoder, f"malformed ARFF file ({type(err).__name__}: {err})") from None
    raise AssertionError("unreachable")


def _located(path: str, decoder: liac_arff.ArffDecoder, message: str) -> ValueError:
    line = getattr(decoder, "_current_line", -1)
    return ValueError(f"{path}, line {line}: {message}")


def _describe(err: liac_arff.ArffException) -> str:
    """liac-arff's message without its own ', at line k.' suffix (we put the line up front)."""
    text = re.sub(r",? (?:at|in) line -?\d+([.:]?)", lambda m: ":" if m.group(1) == ":" else "",
                  str(err), count=1).strip()
    quoted = _QUOTES_FILE_TEXT.get(type(err).__name__)
    m = quoted.match(text) if quoted else None
    if m:
        text = m.group(1) + _clip(m.group(2)) + m.group(3)
    hint = _HINTS.get(type(err).__name__)
    return f"malformed ARFF file: {text}" + (f" ({hint})" if hint else "")


def _attribute(name: str, kind: str | list) -> ArffAttribute:
    if isinstance(kind, (list, tuple)):
        return ArffAttribute(name, "nominal", tuple(str(v) for v in kind))
    if kind.upper() == "STRING":
        return ArffAttribute(name, "string")
    return ArffAttribute(name, "numeric")


def _from_dense(rows: list[list], attributes: list[ArffAttribute], row_lines: np.ndarray,
                path: str) -> tuple[np.ndarray, dict[str, list]]:
    """Rows of python values -> (values [N, A] float64, strings)."""
    A = len(attributes)
    obj = np.empty((len(rows), A), dtype=object)
    if rows:
        obj[:] = rows
    values = np.full((len(rows), A), np.nan)
    strings: dict[str, list] = {}
    for j, attr in enumerate(attributes):
        col = obj[:, j]
        if attr.kind == "string":
            strings[attr.name] = [None if v is None else str(v) for v in col]
            continue
        # liac-arff has already converted numbers to float and nominals to int; a str left over
        # is a value it failed to convert (it swallows some conversion errors, e.g. INTEGER "nan")
        bad = np.flatnonzero([isinstance(v, str) for v in col])
        if bad.size:
            i = int(bad[0])
            raise ValueError(f"{path}, line {row_lines[i]}: malformed ARFF file: value {_clip(repr(col[i]))} of "
                             f"{attr.kind} attribute {attr.name!r} could not be converted")
        present = ~np.equal(col, None)
        values[present, j] = col[present].astype(np.float64)
    return values, strings


def _from_coo(coo: tuple[list, list, list], attributes: list[ArffAttribute],
              num_rows: int) -> tuple[np.ndarray, dict[str, list]]:
    """liac-arff COO triplets -> (values [N, A] float64, strings); omitted entries are 0."""
    data, rows, cols = coo
    values = np.zeros((num_rows, len(attributes)))
    string_cols = {j for j, a in enumerate(attributes) if a.kind == "string"}
    strings: dict[str, list] = {attributes[j].name: [""] * num_rows for j in string_cols}
    for j in string_cols:
        values[:, j] = np.nan
    keep = []
    for k, (v, r, c) in enumerate(zip(data, rows, cols)):
        if c in string_cols:
            strings[attributes[c].name][r] = None if v is None else str(v)
        else:
            keep.append(k)
    if keep:
        idx = np.asarray(keep)
        vals = np.asarray(data, dtype=object)[idx]
        vals = np.where(np.equal(vals, None), np.nan, vals).astype(np.float64)
        values[np.asarray(rows)[idx], np.asarray(cols)[idx]] = vals
    return values, strings

