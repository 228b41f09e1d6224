"""The upload store's guard (batching/ui/upload_guard.py) on Streamlit's own MemoryUploadedFileManager, without a
server (tests/test_hosting_uploads.py runs it in one): files put before the guard is installed are dropped, a session
not allowed gets 403, an allowed one keeps at most twice the upload limit, oldest out first, and a refused session
loses what it held."""
from __future__ import annotations

import pytest
from starlette.exceptions import HTTPException
from streamlit.runtime import Runtime
from streamlit.runtime.memory_uploaded_file_manager import MemoryUploadedFileManager
from streamlit.runtime.uploaded_file_manager import UploadedFileRec
from streamlit.testing.v1.util import patch_config_options

from batching.ui import upload_guard

MB = 1024 * 1024


class _Runtime:
    def __init__(self, mgr) -> None:
        self.uploaded_file_mgr = mgr


@pytest.fixture
def store(monkeypatch):
    mgr = MemoryUploadedFileManager("/_stcore/upload_file")
    monkeypatch.setattr(Runtime, "exists", classmethod(lambda cls: True))
    monkeypatch.setattr(Runtime, "instance", classmethod(lambda cls: _Runtime(mgr)))
    with patch_config_options({"server.maxUploadSize": 2}):
        yield mgr


def _put(mgr, sid: str, fid: str, mb: float) -> None:
    mgr.add_file(sid, UploadedFileRec(file_id=fid, name=f"{fid}.csv", type="text/csv", data=b"x" * int(mb * MB)))


def _session(monkeypatch, sid: str) -> None:
    monkeypatch.setattr(upload_guard, "_session_id", lambda: sid)


def test_files_put_before_the_guard_are_dropped_and_unknown_sessions_refused(store, monkeypatch):
    _put(store, "early", "a", 1.0)  # Streamlit's own store keeps it
    assert store.get_files("early", ["a"])
    _session(monkeypatch, "visitor")
    upload_guard.refuse()  # the first page that runs installs the guard
    assert isinstance(store, upload_guard.GuardedUploadedFileManager)
    assert not store.get_files("early", ["a"]) and store._total_bytes == 0 and store._file_count == 0
    for sid in ("early", "visitor"):
        with pytest.raises(HTTPException) as refused:
            _put(store, sid, "b", 0.5)
        assert refused.value.status_code == 403
    assert store._total_bytes == 0


def test_an_allowed_session_keeps_twice_the_limit_oldest_out_first(store, monkeypatch):
    _session(monkeypatch, "ada")
    upload_guard.allow()
    for fid in "abc":
        _put(store, "ada", fid, 1.5)  # limit 2 MB: the quota holds two of these
    assert [f.file_id for f in store.get_files("ada", list("abc"))] == ["b", "c"]
    assert store._total_bytes == 3 * MB and store._file_count == 2
    for fid in "defgh":
        _put(store, "ada", fid, 0.01)
    assert len(store.file_storage["ada"]) == upload_guard.MAX_FILES
    upload_guard.refuse()  # signed out: what the session held goes
    assert "ada" not in store.file_storage and store._total_bytes == 0 and store._file_count == 0
    with pytest.raises(HTTPException):
        _put(store, "ada", "i", 0.01)
