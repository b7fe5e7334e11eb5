"""Mulan datasets by name: the shipped catalog, the verified download cache, and its failure modes.

Downloads are served by a local HTTP server (127.0.0.1, a free port) from a temporary folder laid out
``<dataset>/<file>``; the catalog is replaced by one listing the sha256 of small generated files.
"""

from __future__ import annotations

import hashlib
import threading
import urllib.error
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir

from structtorch.data import (
    DownloadError,
    MultilabelDataModule,
    download,
    fetch_mulan,
    fill_cache_from,
    load_mulan,
    load_mulan_splits,
    mulan_cache_dir,
    mulan_datasets,
)
from structtorch.data.download import MULAN_RAW_URL, mulan_files
from structtorch.train import build_datamodule

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "data" / "mulan"
LABELS = ["y0", "y1", "y2", "y3", "y4"]
X = np.arange(24, dtype=float).reshape(8, 3) / 4
# train label frequencies (rows 0-5): y0 2, y1 3, y2 2, y3 0, y4 2; test rows 6-7
Y = np.array([[1, 1, 0, 0, 1], [0, 1, 1, 0, 0], [1, 0, 0, 0, 1], [0, 1, 1, 0, 0], [0, 0, 0, 0, 0],
              [0, 0, 0, 0, 0], [1, 1, 1, 1, 1], [0, 0, 1, 0, 0]])


def _arff(x: np.ndarray, y: np.ndarray) -> bytes:
    head = "@relation tiny\n" + "".join(f"@attribute f{j} numeric\n" for j in range(x.shape[1]))
    head += "".join(f"@attribute {n} {{0,1}}\n" for n in LABELS) + "@data\n"
    rows = "".join(",".join([*(f"{v:g}" for v in xr), *map(str, yr)]) + "\n" for xr, yr in zip(x, y))
    return (head + rows).encode()


XML = ('<?xml version="1.0" encoding="utf-8"?>\n<labels xmlns="http://mulan.sourceforge.net/labels">\n'
       + "".join(f'<label name="{n}"></label>\n' for n in LABELS) + "</labels>\n").encode()
FILES = {  # dataset -> file -> bytes
    "tiny": {"tiny-train.arff": _arff(X[:6], Y[:6]), "tiny-test.arff": _arff(X[6:], Y[6:]), "tiny.xml": XML},
    "solo": {"solo.arff": _arff(X, Y), "solo.xml": XML},  # no train/test split
    "half": {"half-test.arff": _arff(X, Y), "half.xml": XML},  # no training data at all
}


class Server:
    """``http.server`` in a thread serving ``<directory>/<dataset>/<file>``; counts the requests.

    ``truncate``: paths answered with a Content-Length larger than the body, then a closed connection.
    """

    def __init__(self, directory: Path) -> None:
        self.requests: list[str] = []
        self.truncate: set[str] = set()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                server.requests.append(self.path)
                path = directory / self.path.lstrip("/")
                if not path.is_file():
                    self.send_error(404)
                    return
                body = path.read_bytes()
                cut = self.path in server.truncate
                self.send_response(200)
                self.send_header("Content-Length", str(len(body) + 1000 if cut else len(body)))
                self.end_headers()
                self.wfile.write(body[: len(body) // 2] if cut else body)
                self.close_connection = True

            def log_message(self, *args) -> None:  # noqa: ANN002
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        if self.thread.is_alive():
            self.httpd.shutdown()
            self.httpd.server_close()
            self.thread.join()


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _write_tree(root: Path, files: dict[str, dict[str, bytes]]) -> Path:
    for dataset, content in files.items():
        (root / dataset).mkdir(parents=True, exist_ok=True)
        for name, data in content.items():
            (root / dataset / name).write_bytes(data)
    return root


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A test catalog of FILES, the cache in tmp_path/cache, and a server holding FILES."""
    rows = ["dataset\tfile\tbytes\tsha256"] + [f"{d}\t{f}\t{len(b)}\t{_sha(b)}" for d, c in FILES.items()
                                               for f, b in c.items()]
    catalog = tmp_path / "catalog.tsv"
    catalog.write_text("\n".join(rows) + "\n")
    monkeypatch.setattr(download, "CATALOG_PATH", catalog)
    monkeypatch.setenv("STRUCTTORCH_DATA", str(tmp_path / "cache"))
    for var in ("http_proxy", "HTTP_PROXY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    served = _write_tree(tmp_path / "served", FILES)
    server = Server(served)
    yield server, served, tmp_path / "cache" / "mulan"
    server.stop()


def _forbid_network(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        raise AssertionError("a network request was made")

    monkeypatch.setattr(download.urllib.request, "urlopen", refuse)


def _leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir()) if directory.is_dir() else []


# ---------------------------------------------------------------------- downloading and the cache
def test_first_download_fills_the_cache_and_loads(env) -> None:
    server, _, cache = env
    x, y, feats, labels = load_mulan("tiny", "train", url=server.url, progress=False)
    np.testing.assert_allclose(x.numpy(), X[:6])
    np.testing.assert_array_equal(y.numpy(), Y[:6])
    assert feats == ["f0", "f1", "f2"] and labels == LABELS
    assert sorted(server.requests) == ["/tiny/tiny-test.arff", "/tiny/tiny-train.arff", "/tiny/tiny.xml"]
    assert _leftovers(cache / "tiny") == ["tiny-test.arff", "tiny-train.arff", "tiny.xml"]  # no temp files
    assert (cache / "tiny" / "tiny-train.arff").read_bytes() == FILES["tiny"]["tiny-train.arff"]


def test_a_complete_cache_makes_no_network_request(env, monkeypatch) -> None:
    server, _, _ = env
    first = load_mulan_splits("tiny", url=server.url, progress=False)
    n = len(server.requests)
    again = load_mulan_splits("tiny", url=server.url, progress=False)
    assert len(server.requests) == n == 3
    server.stop()  # offline now
    _forbid_network(monkeypatch)
    offline = load_mulan_splits("tiny", url=server.url, progress=False)
    for d in (again, offline):
        assert torch.equal(d.x_train, first.x_train) and torch.equal(d.y_test, first.y_test)


def test_progress_bar_goes_to_stderr(env, capsys) -> None:
    server, _, _ = env
    fetch_mulan("tiny", url=server.url)
    out = capsys.readouterr()
    assert "tiny/tiny-train.arff" in out.err and out.out == ""
    fetch_mulan("tiny", url=server.url)  # cached: nothing to show
    assert capsys.readouterr().err == ""


def test_corrupt_file_on_the_server_raises_and_saves_nothing(env) -> None:
    server, served, cache = env
    (served / "tiny" / "tiny-train.arff").write_bytes(FILES["tiny"]["tiny-train.arff"].replace(b"0.25", b"0.75"))
    expected = _sha(FILES["tiny"]["tiny-train.arff"])
    with pytest.raises(DownloadError) as err:
        load_mulan("tiny", url=server.url, progress=False)
    msg = str(err.value)
    assert f"{server.url}/tiny/tiny-train.arff" in msg and expected in msg
    assert _sha((served / "tiny" / "tiny-train.arff").read_bytes()) in msg  # what was got
    assert "tiny-train.arff" not in _leftovers(cache / "tiny")
    assert not any(name.endswith(".part") for name in _leftovers(cache / "tiny"))


def test_connection_dropped_mid_file_raises_and_leaves_no_partial_file(env) -> None:
    server, _, cache = env
    server.truncate.add("/tiny/tiny-test.arff")
    with pytest.raises(DownloadError, match=r"tiny-test\.arff.*cut off") as err:
        load_mulan("tiny", url=server.url, progress=False)
    assert _sha(FILES["tiny"]["tiny-test.arff"]) in str(err.value)
    assert "/tiny/tiny-test.arff" in server.requests
    assert "tiny-test.arff" not in _leftovers(cache / "tiny")
    assert not any(name.endswith(".part") for name in _leftovers(cache / "tiny"))
    server.truncate.clear()  # the next attempt completes the cache
    x, _, _, _ = load_mulan("tiny", "test", url=server.url, progress=False)
    np.testing.assert_allclose(x.numpy(), X[6:])


def test_http_error_is_a_download_error(env) -> None:
    server, served, _ = env
    (served / "tiny" / "tiny.xml").unlink()
    with pytest.raises(DownloadError, match=r"tiny/tiny\.xml failed .*HTTPError.*404"):
        fetch_mulan("tiny", url=server.url, progress=False)


def test_default_url_is_the_pinned_mulan_repository(env, monkeypatch) -> None:
    asked = []

    def offline(url, timeout):  # noqa: ANN001, ANN202
        asked.append(url)
        raise urllib.error.URLError("no network in tests")

    monkeypatch.setattr(download.urllib.request, "urlopen", offline)
    with pytest.raises(DownloadError, match="no network in tests"):
        fetch_mulan("tiny", progress=False)
    assert asked[0] == ("https://raw.githubusercontent.com/tsoumakas/mulan/43f6389095ad71984264db4387a8074b22bc7d4a"
                        "/data/multi-label/tiny/tiny-train.arff") == f"{MULAN_RAW_URL}/tiny/tiny-train.arff"


def test_corrupt_cached_file_is_downloaded_again(env) -> None:
    server, _, cache = env
    fetch_mulan("tiny", url=server.url, progress=False)
    (cache / "tiny" / "tiny-train.arff").write_bytes(b"@relation broken\n")
    server.requests.clear()
    with pytest.warns(UserWarning, match=r"tiny-train\.arff: sha256 .* does not match .*downloading it again"):
        x, _, _, _ = load_mulan("tiny", url=server.url, progress=False)
    assert server.requests == ["/tiny/tiny-train.arff"]
    assert (cache / "tiny" / "tiny-train.arff").read_bytes() == FILES["tiny"]["tiny-train.arff"]
    np.testing.assert_allclose(x.numpy(), X[:6])


def test_structtorch_data_env_var_sets_the_cache(env, tmp_path, monkeypatch) -> None:
    server, _, _ = env
    monkeypatch.setenv("STRUCTTORCH_DATA", str(tmp_path / "elsewhere"))
    assert mulan_cache_dir() == tmp_path / "elsewhere"
    assert fetch_mulan("tiny", url=server.url, progress=False) == tmp_path / "elsewhere" / "mulan" / "tiny"
    assert (tmp_path / "elsewhere" / "mulan" / "tiny" / "tiny.xml").read_bytes() == XML
    assert not (tmp_path / "cache").exists()
    monkeypatch.delenv("STRUCTTORCH_DATA")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert mulan_cache_dir() == tmp_path / "home" / ".cache" / "structtorch"


def test_single_file_dataset_is_split_and_dataset_without_training_data_is_refused(env) -> None:
    server, _, _ = env
    d = load_mulan_splits("solo", url=server.url, test_fraction=0.25, seed=0, progress=False)
    assert not d.test_from_file and len(d.x_train) == 6 and len(d.x_test) == 2
    assert sorted(server.requests) == ["/solo/solo.arff", "/solo/solo.xml"]
    with pytest.raises(ValueError, match=r"'half' has no training data .*half-test\.arff.*root=<dir>"):
        load_mulan("half", url=server.url)


# ---------------------------------------------------------------------- names, local copies, max_labels
def test_unknown_name_suggests_close_names(env) -> None:
    with pytest.raises(ValueError, match=r"unknown Mulan dataset 'tinny'\. Did you mean 'tiny'\?.*"
                                         r"structtorch\.data\.mulan_datasets\(\)"):
        load_mulan("tinny")
    assert mulan_datasets() == ["half", "solo", "tiny"]
    assert env[0].requests == []


def test_local_root_is_used_as_is_without_network(env, tmp_path, monkeypatch) -> None:
    server, _, cache = env
    server.stop()
    _forbid_network(monkeypatch)
    other = {"tiny": {"tiny-train.arff": _arff(X[:3], Y[:3]), "tiny-test.arff": _arff(X[3:], Y[3:]), "tiny.xml": XML}}
    root = _write_tree(tmp_path / "mine", other)  # not the catalog's files: allowed for a local copy
    x, y, _, labels = load_mulan("tiny", "test", root=root)
    np.testing.assert_array_equal(y.numpy(), Y[3:])
    assert fetch_mulan("tiny", root=root) == root / "tiny" and not cache.exists()
    dm = MultilabelDataModule("tiny", str(root), val_fraction=0.0)
    dm.prepare_data()
    assert dm.num_labels == 5 and len(dm.train_tensors[0]) == 3
    with pytest.raises(FileNotFoundError, match=r"<root>/solo/solo-train\.arff"):
        fetch_mulan("solo", root=root)


def test_local_root_accepts_the_mulan_repository_file_names(tmp_path) -> None:
    # the real catalog: tmc2007's files are tmc2007-500-train.arff, tmc2007-500-test.arff, tmc2007-500.xml
    root = _write_tree(tmp_path, {"tmc2007": {"tmc2007-500-train.arff": _arff(X[:6], Y[:6]),
                                              "tmc2007-500-test.arff": _arff(X[6:], Y[6:]), "tmc2007-500.xml": XML}})
    d = load_mulan_splits("tmc2007", root=root)
    assert d.test_from_file and len(d.x_train) == 6 and d.label_names == LABELS


def test_max_labels_keeps_the_most_frequent_training_labels(env) -> None:
    server, _, _ = env
    d = load_mulan_splits("tiny", url=server.url, max_labels=3, progress=False)
    # train frequencies y0 2, y1 3, y2 2, y3 0, y4 2: y1 first, then the ties y0, y2 by lower index
    assert d.label_names == ["y0", "y1", "y2"]
    np.testing.assert_array_equal(d.y_train.numpy(), Y[:6, :3])
    np.testing.assert_array_equal(d.y_test.numpy(), Y[6:, :3])
    assert load_mulan_splits("tiny", url=server.url, max_labels=1, progress=False).label_names == ["y1"]
    assert load_mulan_splits("tiny", url=server.url, max_labels=5, progress=False).label_names == LABELS
    for bad in (0, 6, 2.0, True):
        with pytest.raises(ValueError, match=r"max_labels must be None or an int in \[1, 5\]"):
            load_mulan_splits("tiny", url=server.url, max_labels=bad, progress=False)


def test_hydra_data_mulan_by_name(env) -> None:
    server, _, _ = env
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=["data=mulan", "data.name=tiny", f"data.url={server.url}",
                                           "data.max_labels=2", "data.val_fraction=0"])
        missing = compose("config", overrides=["data=mulan"])
        emotions = compose("config", overrides=["data=emotions"])
    assert cfg.data.root is None and emotions.data.root is None and emotions.data.name == "emotions"
    dm = build_datamodule(cfg.data)
    dm.prepare_data()
    assert dm.num_labels == 2 and dm.label_names == ["y0", "y1"]
    with pytest.raises(ValueError, match=r"data=mulan needs data\.name=<dataset>, one of: half, solo, tiny"):
        build_datamodule(missing.data)


# ---------------------------------------------------------------------- fill_cache_from
def test_fill_cache_from_a_local_tree_then_load_offline(env, tmp_path, monkeypatch) -> None:
    server, _, cache = env
    server.stop()
    src = _write_tree(tmp_path / "src", {"tiny": FILES["tiny"]})
    (src / "tiny" / "README.md").write_text("not in the catalog")
    fill_cache_from(src)
    assert _leftovers(cache / "tiny") == ["tiny-test.arff", "tiny-train.arff", "tiny.xml"]
    _forbid_network(monkeypatch)
    x, _, _, _ = load_mulan("tiny", url=server.url)
    np.testing.assert_allclose(x.numpy(), X[:6])
    fill_cache_from(src, tmp_path / "other")
    assert (tmp_path / "other" / "mulan" / "tiny" / "tiny.xml").read_bytes() == XML


def test_fill_cache_from_refuses_files_that_do_not_match(env, tmp_path) -> None:
    _, _, cache = env
    src = _write_tree(tmp_path / "src", {"solo": {"solo.arff": b"@relation other\n", "solo.xml": XML}})
    with pytest.raises(ValueError, match=_sha(FILES["solo"]["solo.arff"])):
        fill_cache_from(src)
    assert not (cache / "solo" / "solo.arff").exists()
    with pytest.raises(ValueError, match="no file of the Mulan catalog"):
        fill_cache_from(tmp_path / "empty")


# ---------------------------------------------------------------------- the shipped catalog
def test_shipped_catalog_file_roles() -> None:
    names = mulan_datasets()
    assert {"scene", "emotions", "yeast", "medical", "enron", "bibtex"} <= set(names) and names == sorted(names)
    pick = lambda name: {role: f.file for role, f in mulan_files(name).items()}  # noqa: E731
    assert pick("emotions") == {"train": "emotions-train.arff", "test": "emotions-test.arff", "xml": "emotions.xml"}
    assert pick("tmc2007") == {"train": "tmc2007-500-train.arff", "test": "tmc2007-500-test.arff",
                               "xml": "tmc2007-500.xml"}
    assert pick("corel5k") == {"train": "Corel5k-train-sparse.arff", "test": "Corel5k-test-sparse.arff",
                               "xml": "Corel5k.xml"}
    assert pick("cal500") == {"full": "cal500.arff", "xml": "cal500.xml"}
    for name in ("bookmarks", "corel16k"):
        with pytest.raises(ValueError, match="no training data"):
            mulan_files(name)


@pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/data/mulan not present")
@pytest.mark.parametrize("name", ["scene", "emotions", "yeast"])
def test_shipped_catalog_matches_the_shared_copy(name: str) -> None:
    files = mulan_files(name)
    assert set(files) == {"train", "test", "xml"}
    for entry in files.values():
        data = (SHARED / name / entry.file).read_bytes()
        assert (len(data), _sha(data)) == (entry.size, entry.sha256)


@pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/data/mulan not present")
def test_real_emotions_from_a_filled_cache_offline(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("STRUCTTORCH_DATA", str(tmp_path))
    fill_cache_from(SHARED)
    _forbid_network(monkeypatch)
    d = load_mulan_splits("emotions")
    assert d.x_train.shape == (391, 72) and d.y_train.shape == (391, 6) and d.x_test.shape == (202, 72)
    assert abs(d.y_train.sum(1).float().mean().item() - 1.813) < 1e-3  # label cardinality from the README
