"""Datasets by name: the Mulan catalog of files (size, sha256) with a verified download cache, and the Weizmann
horses (images and masks, sha256 shipped in the package) filled into the same cache from a local copy.

Files are cached as ``<cache>/mulan/<dataset>/<file>``, where ``<cache>`` is ``$STRUCTTORCH_DATA``
(default ``~/.cache/structtorch``). A cached file is used only if its sha256 matches the catalog,
and a cache filled beforehand (e.g. by ``fill_cache_from``) works offline: no network request is
made when every needed file is present and intact. Downloads go to a temporary file in the
dataset directory, are checked (size and sha256) and only then renamed to their final name, so a
partial or corrupt file never appears under that name.

The default download source is the Mulan project's GitHub repository at a pinned commit
(``MULAN_RAW_URL``); ``url=`` points elsewhere (a mirror laid out as ``<url>/<dataset>/<file>``).

The horses live in ``<cache>/horses/{rgb,figure_ground}/horseNNN.jpg``: ``fill_horses_cache(<folder>)`` copies them
from a local copy, each file checked against ``horses_sha256sums.txt`` (a ``sha256sum`` listing), and
``horses_dir()`` returns the folder only when every listed file is there with its checksum.
"""

from __future__ import annotations

import difflib
import hashlib
import http.client
import os
import re
import shutil
import sys
import tempfile
import urllib.error
import urllib.parse
import urllib.request
import warnings
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import BinaryIO

from tqdm import tqdm

__all__ = ["CATALOG_PATH", "HORSES_SUMS_PATH", "MULAN_COMMIT", "MULAN_RAW_URL", "CatalogFile", "DownloadError",
           "fetch_mulan", "fill_cache_from", "fill_horses_cache", "horses_checksums", "horses_dir", "mulan_cache_dir",
           "mulan_catalog", "mulan_datasets", "mulan_files", "uncached_mulan_files"]

MULAN_COMMIT = "43f6389095ad71984264db4387a8074b22bc7d4a"
MULAN_RAW_URL = f"https://raw.githubusercontent.com/tsoumakas/mulan/{MULAN_COMMIT}/data/multi-label"
CATALOG_PATH = resources.files(__package__).joinpath("mulan_catalog.tsv")
HORSES_SUMS_PATH = resources.files(__package__).joinpath("horses_sha256sums.txt")
#: where the horses come from, for the error that says how to fill the cache
HORSES_SOURCE = ("the weizmann_horse_db/ folder of github.com/shenshutao/image_segmentation at commit "
                 "2653401d6ea617026895aac17059eb57e017abcb")
TIMEOUT_S = 60.0
_CHUNK = 1 << 16
_ARFF_RE = re.compile(r"^(?P<stem>.+?)(?:-(?P<role>train|test))?(?P<sparse>-sparse)?\.arff$")
_NETWORK_ERRORS = (urllib.error.URLError, http.client.HTTPException, ConnectionError, TimeoutError)


class DownloadError(RuntimeError):
    """A file could not be downloaded, or what arrived is not the file of the catalog."""


@dataclass(frozen=True)
class CatalogFile:
    """One file of the Mulan collection: ``<dataset>/<file>``, its size in bytes and its sha256 (hex)."""

    dataset: str
    file: str
    size: int
    sha256: str


# ---------------------------------------------------------------------- the catalog
def mulan_catalog() -> dict[str, list[CatalogFile]]:
    """The catalog (``CATALOG_PATH``, a TSV ``dataset file bytes sha256``): dataset -> its files."""
    lines = CATALOG_PATH.read_text(encoding="utf-8").splitlines()
    if not lines or lines[0].split("\t") != ["dataset", "file", "bytes", "sha256"]:
        raise ValueError(f"{CATALOG_PATH}: expected the header 'dataset<TAB>file<TAB>bytes<TAB>sha256'")
    catalog: dict[str, list[CatalogFile]] = {}
    for k, line in enumerate(lines[1:], start=2):
        fields = line.split("\t")
        if len(fields) != 4 or not fields[2].isdigit() or not re.fullmatch(r"[0-9a-f]{64}", fields[3]):
            raise ValueError(f"{CATALOG_PATH}, line {k}: expected 'dataset file bytes sha256', got {line!r}")
        catalog.setdefault(fields[0], []).append(CatalogFile(fields[0], fields[1], int(fields[2]), fields[3]))
    return catalog


def mulan_datasets() -> list[str]:
    """The names of all datasets in the Mulan catalog, sorted."""
    return sorted(mulan_catalog())


def _catalog_entry(name: str) -> list[CatalogFile]:
    """The catalog files of dataset ``name``; ValueError with close names if there is no such dataset."""
    catalog = mulan_catalog()
    if name in catalog:
        return catalog[name]
    close = difflib.get_close_matches(str(name).lower(), list(catalog), n=3, cutoff=0.5)
    hint = f" Did you mean {' or '.join(map(repr, close))}?" if close else ""
    raise ValueError(f"unknown Mulan dataset {name!r}.{hint} structtorch.data.mulan_datasets() lists all "
                     f"{len(catalog)}: {', '.join(sorted(catalog))}. For a dataset of your own, pass "
                     f"root=<dir> (data.root=<dir>) holding <dir>/{name}/{name}-train.arff, ...")


def mulan_files(name: str) -> dict[str, CatalogFile]:
    """The catalog files the loader needs for dataset ``name``, by role.

    Roles: ``train``, ``test`` and ``xml``, or ``full`` (one file, no train/test split) and ``xml``
    when the collection has no training file. Where a dataset only has sparse ARFF training data
    (corel5k) the sparse train/test pair is used. ValueError for an unknown dataset, or one whose
    data files are not in the collection (bookmarks, corel16k).
    """
    files = _catalog_entry(name)
    stems: dict[str, dict[tuple[str, bool], CatalogFile]] = {}
    xml = {f.file[: -len(".xml")]: f for f in files if f.file.endswith(".xml")}
    for f in files:
        m = _ARFF_RE.match(f.file)
        if m:
            stems.setdefault(m["stem"], {})[(m["role"] or "full", bool(m["sparse"]))] = f
    order = sorted(stems, key=lambda s: (s.lower() != name.lower(), s))
    for role in ("train", "full"):
        for stem in order:
            for sparse in (False, True):
                if (role, sparse) in stems[stem]:
                    return _with_partners(stems[stem], role, sparse, xml.get(stem))
    raise ValueError(f"Mulan dataset {name!r} has no training data in the Mulan repository at commit "
                     f"{MULAN_COMMIT[:12]} (files there: {', '.join(f.file for f in files)}). Get it "
                     f"elsewhere and pass root=<dir> holding <dir>/{name}/{name}-train.arff, ...")


def _with_partners(variants: dict[tuple[str, bool], CatalogFile], role: str, sparse: bool,
                   xml: CatalogFile | None) -> dict[str, CatalogFile]:
    out = {role: variants[(role, sparse)]}
    if role == "train":
        test = variants.get(("test", sparse)) or variants.get(("test", not sparse))
        if test is not None:
            out["test"] = test
    if xml is not None:
        out["xml"] = xml
    return out


# ---------------------------------------------------------------------- the cache
def mulan_cache_dir() -> Path:
    """``$STRUCTTORCH_DATA`` (default ``~/.cache/structtorch``); Mulan files live under ``<it>/mulan``."""
    return Path(os.path.expanduser(os.environ.get("STRUCTTORCH_DATA") or "~/.cache/structtorch"))


def uncached_mulan_files(name: str) -> list[str]:
    """The files of Mulan dataset ``name`` (``mulan_files``) that the data cache ``<cache>/mulan/<name>/`` lacks: []
    once it holds them all (present, not checked against the catalog's sha256). ValueError as ``mulan_files``."""
    directory = mulan_cache_dir() / "mulan" / name
    return [f.file for f in mulan_files(name).values() if not (directory / f.file).is_file()]


def fetch_mulan(name: str, root: str | os.PathLike | None = None, url: str | None = None,
                progress: bool = True) -> Path:
    """The directory holding dataset ``name``'s files, downloading what is missing or corrupt.

    root: a local copy laid out ``<root>/<name>/...``, used as is (no download, no checksums);
        FileNotFoundError if ``<root>/<name>`` is not a directory.
    url: download base, files are fetched from ``<url>/<dataset>/<file>`` (default ``MULAN_RAW_URL``).
    progress: show a progress bar on stderr while downloading.

    Without root, each file of ``mulan_files(name)`` is looked up in ``<cache>/mulan/<name>/``: one
    whose sha256 matches the catalog is reused (so a complete cache makes no network request), a
    corrupt one is downloaded again (with a warning). Raises DownloadError if a download fails or
    does not match the catalog, ValueError for an unknown dataset name.
    """
    if root is not None:
        directory = Path(os.path.expanduser(os.fspath(root))) / name
        if not directory.is_dir():
            raise FileNotFoundError(f"Mulan dataset {name!r} not found under root={os.fspath(root)!r}: "
                                    f"{directory.resolve()} is not a directory. Expected layout: "
                                    f"<root>/{name}/{name}-train.arff, <root>/{name}/{name}-test.arff, "
                                    f"<root>/{name}/{name}.xml (or leave root unset to download by name)")
        return directory
    files = mulan_files(name)
    directory = mulan_cache_dir() / "mulan" / name
    base = (url or MULAN_RAW_URL).rstrip("/")
    created = [d for d in (directory, *directory.parents) if not d.exists()]
    try:
        for entry in files.values():
            _fetch_file(entry, directory, base, progress)
    except DownloadError as err:
        for d in created:  # deepest first: leave no empty folder behind
            if d.is_dir() and not any(d.iterdir()):
                d.rmdir()
        raise DownloadError(f"Mulan dataset {name!r} is not in the data cache {directory} and {err}. To work "
                            f"offline, set STRUCTTORCH_DATA=<folder> to a filled cache (<folder>/mulan/{name}/...) "
                            f"or pass root=<dir> (data.root=<dir>) holding <dir>/{name}/{name}-train.arff, "
                            f"{name}-test.arff, {name}.xml") from err
    return directory


def _fetch_file(entry: CatalogFile, directory: Path, base: str, progress: bool) -> None:
    """``directory / entry.file``, reused when its sha256 matches the catalog, else downloaded from ``base``."""
    path = directory / entry.file
    if path.is_file():
        got = _sha256(path)
        if got == entry.sha256:
            return
        warnings.warn(f"{path}: sha256 {got} does not match the catalog's {entry.sha256}; "
                      f"downloading it again", UserWarning, stacklevel=3)
        path.unlink()
    directory.mkdir(parents=True, exist_ok=True)
    _download(f"{base}/{urllib.parse.quote(entry.dataset)}/{urllib.parse.quote(entry.file)}", entry, path, progress)


def fill_cache_from(src_root: str | os.PathLike, cache_dir: str | os.PathLike | None = None) -> None:
    """Copy a local Mulan tree ``<src_root>/<dataset>/<file>`` into the cache layout, offline.

    Every file of ``src_root`` that the catalog lists is checked (size and sha256) and copied to
    ``<cache_dir>/mulan/<dataset>/<file>`` (cache_dir default: ``mulan_cache_dir()``); other files
    are ignored. ValueError if a listed file does not match the catalog (nothing is copied for it)
    or if ``src_root`` holds no catalog file at all.
    """
    src = Path(os.fspath(src_root))
    dest = Path(os.path.expanduser(os.fspath(cache_dir))) if cache_dir is not None else mulan_cache_dir()
    copied = 0
    for dataset, files in mulan_catalog().items():
        for entry in files:
            path = src / dataset / entry.file
            if not path.is_file():
                continue
            size, got = path.stat().st_size, _sha256(path)
            if (size, got) != (entry.size, entry.sha256):
                raise ValueError(f"{path}: expected {entry.size} bytes with sha256 {entry.sha256} (the catalog), "
                                 f"got {size} bytes with sha256 {got}")
            _copy_atomically(path, dest / "mulan" / dataset / entry.file)
            copied += 1
    if not copied:
        raise ValueError(f"no file of the Mulan catalog found under {src.resolve()} (expected <src_root>/<dataset>/"
                         f"<file>, e.g. <src_root>/emotions/emotions-train.arff)")


# ---------------------------------------------------------------------- the Weizmann horses
def horses_checksums() -> dict[str, str]:
    """The horses' files, ``rgb/horseNNN.jpg`` and ``figure_ground/horseNNN.jpg``, -> sha256 (``HORSES_SUMS_PATH``)."""
    sums = {}
    for k, line in enumerate(HORSES_SUMS_PATH.read_text(encoding="utf-8").splitlines(), start=1):
        m = re.fullmatch(r"([0-9a-f]{64}) [ *](\S+)", line)
        if m is None:
            raise ValueError(f"{HORSES_SUMS_PATH}, line {k}: expected '<sha256>  <file>', got {line!r}")
        sums[m[2]] = m[1]
    return sums


def horses_dir() -> Path:
    """``<cache>/horses`` (``$STRUCTTORCH_DATA``, default ``~/.cache/structtorch``) when it holds every file of
    ``horses_checksums()`` with its sha256; FileNotFoundError naming the folder and how to fill it otherwise."""
    directory = mulan_cache_dir() / "horses"
    sums = horses_checksums()
    missing = [f for f in sums if not (directory / f).is_file()]
    wrong = [f for f in sums if f not in missing and _sha256(directory / f) != sums[f]]
    if missing or wrong:
        what = f"{len(missing)} of its {len(sums)} files are missing" if missing else \
            f"{len(wrong)} files do not match their sha256 ({', '.join(wrong[:3])})"
        raise FileNotFoundError(
            f"the Weizmann horses are not in the data cache {directory} ({what}): fill it with "
            f"structtorch.data.fill_horses_cache(<folder>) from a copy laid out <folder>/rgb/horseNNN.jpg + "
            f"<folder>/figure_ground/horseNNN.jpg ({HORSES_SOURCE}), set STRUCTTORCH_DATA to a filled cache, or "
            f"pass data.root=<folder> to read a folder of images and masks as it is")
    return directory


def fill_horses_cache(src_root: str | os.PathLike, cache_dir: str | os.PathLike | None = None) -> Path:
    """Copy the horses from a local folder ``<src_root>/rgb/``, ``<src_root>/figure_ground/`` into
    ``<cache_dir>/horses/`` (cache_dir default: ``mulan_cache_dir()``), offline, and return that folder.

    Every file of ``horses_checksums()`` is checked before anything is copied: FileNotFoundError if some are missing
    from ``src_root``, ValueError if one's sha256 differs. Other files of ``src_root`` are ignored.
    """
    src = Path(os.path.expanduser(os.fspath(src_root)))
    dest = (Path(os.path.expanduser(os.fspath(cache_dir))) if cache_dir is not None else mulan_cache_dir()) / "horses"
    sums = horses_checksums()
    missing = [f for f in sums if not (src / f).is_file()]
    if missing:
        raise FileNotFoundError(f"{src.resolve()} lacks {len(missing)} of the {len(sums)} horse files (e.g. "
                                f"{', '.join(missing[:3])}); expected <folder>/rgb/horseNNN.jpg and "
                                f"<folder>/figure_ground/horseNNN.jpg ({HORSES_SOURCE})")
    for f, expected in sums.items():
        got = _sha256(src / f)
        if got != expected:
            raise ValueError(f"{src / f}: sha256 {got}, expected {expected} (structtorch's {HORSES_SUMS_PATH.name})")
    for f in sums:
        _copy_atomically(src / f, dest / f)
    return dest


# ---------------------------------------------------------------------- helpers
def _copy_atomically(path: Path, target: Path) -> None:
    """Copy ``path`` to ``target`` through a temporary file beside it: ``target`` is never partly written."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temp_file(target)
    try:
        shutil.copyfile(path, tmp)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _temp_file(target: Path) -> Path:
    """A new empty temporary file next to ``target`` (same file system, so ``os.replace`` is atomic)."""
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".part")
    os.close(fd)
    os.chmod(tmp, 0o644)
    return Path(tmp)


def _download(url: str, entry: CatalogFile, target: Path, progress: bool) -> None:
    """Stream ``url`` into a temporary file, check size and sha256, then rename it to ``target``. On failure the
    progress bar stays (ended by a newline), so the error starts on a line of its own."""
    tmp = _temp_file(target)
    try:
        with open(tmp, "wb") as out, tqdm(total=entry.size, unit="B", unit_scale=True, unit_divisor=1024,
                                          desc=f"{entry.dataset}/{entry.file}", file=sys.stderr,
                                          disable=not progress, leave=False) as bar:
            try:
                _stream(url, entry, out, bar)
            except DownloadError:
                bar.leave = True
                raise
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


def _stream(url: str, entry: CatalogFile, out: BinaryIO, bar: tqdm) -> None:
    """Write the file at ``url`` to ``out``; DownloadError unless it is the catalog's file (size, sha256)."""
    expected = f"expected {entry.size} bytes with sha256 {entry.sha256}"
    h, n = hashlib.sha256(), 0
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as response:
            while chunk := response.read(_CHUNK):
                n += len(chunk)
                if n > entry.size:
                    break
                h.update(chunk)
                out.write(chunk)
                bar.update(len(chunk))
    except _NETWORK_ERRORS as err:
        what = "was cut off" if isinstance(err, http.client.IncompleteRead) else "failed"
        reason = err.reason if type(err) is urllib.error.URLError else err  # no "<urlopen error ...>" wrapping
        raise DownloadError(f"downloading {url} {what} after {n} of {entry.size} bytes ({type(err).__name__}: "
                            f"{reason}); nothing was saved") from err
    if n < entry.size:
        raise DownloadError(f"downloading {url} was cut off: the connection closed after {n} of {entry.size} "
                            f"bytes; {expected}; nothing was saved")
    if n > entry.size or h.hexdigest() != entry.sha256:
        got = f"more than {entry.size} bytes" if n > entry.size else f"sha256 {h.hexdigest()}"
        raise DownloadError(f"downloading {url} gave a file that is not the catalog's: {expected}, got {got}; "
                            f"nothing was saved")
