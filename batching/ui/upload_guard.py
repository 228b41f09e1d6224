"""Who may leave uploaded files on the server, and how much: only a session whose page has drawn (signed in, or no
sign-in configured), at most twice the upload limit per session.

Streamlit 1.67 takes ``PUT /_stcore/upload_file/<session>/<file>`` for any live session that presents a matching
XSRF cookie and header (``streamlit/web/server/starlette/starlette_routes.py``, ``create_upload_routes._upload_put``),
and ``MemoryUploadedFileManager.add_file`` keeps every file under any new file id until the session ends: a visitor
still on the sign-in prompt could hold gigabytes. The upload route calls ``add_file`` on the runtime's manager object,
so ``install`` gives that object this subclass's ``add_file`` (no copy of Streamlit's route): a file is refused (HTTP
403) unless ``access.gate`` let the session's page draw, and a session keeps at most ``QUOTA_FACTOR`` x
``server.maxUploadSize`` bytes and ``MAX_FILES`` files, its oldest files dropped first (a replaced trace is the
oldest). ``gate`` calls ``allow`` or ``refuse`` on every run; ``refuse`` also drops what the session held. The body of
one refused request is still read by Streamlit before the check (at most the limit, then freed): the proxy in
``deploy/nginx-batching-explorer.conf`` bounds how many such requests a client may send.
"""
from __future__ import annotations

import threading

from streamlit import config
from streamlit.runtime.memory_uploaded_file_manager import MemoryUploadedFileManager
from streamlit.runtime.uploaded_file_manager import UploadedFileRec

QUOTA_FACTOR = 2  # README, Hosting > Memory: "up to twice the upload limit per session"
MAX_FILES = 4  # the sidebar's trace and the Model and hardware page's profile, each once replaced in flight
REFUSED = "Sign in before uploading files."

_install_lock = threading.Lock()


class GuardedUploadedFileManager(MemoryUploadedFileManager):
    """Streamlit's in-memory upload store that keeps files only for allowed sessions, within a quota."""

    _allowed: set[str]

    def add_file(self, session_id: str, file: UploadedFileRec) -> None:
        from starlette.exceptions import HTTPException  # the route turns it into the response's status

        quota = QUOTA_FACTOR * config.get_option("server.maxUploadSize") * 1024 * 1024
        with self._lock:
            if session_id not in self._allowed:
                raise HTTPException(status_code=403, detail=REFUSED)
        super().add_file(session_id, file)
        with self._lock:  # oldest first out, never the file just added
            held = self.file_storage.get(session_id, {})
            while len(held) > 1 and (len(held) > MAX_FILES or sum(len(f.data) for f in held.values()) > quota):
                oldest = next(iter(held))
                self._total_bytes -= len(held.pop(oldest).data)
                self._file_count -= 1

    def remove_session_files(self, session_id: str) -> None:
        super().remove_session_files(session_id)
        with self._lock:
            self._allowed.discard(session_id)

    def set_allowed(self, session_id: str, allowed: bool) -> None:
        with self._lock:
            (self._allowed.add if allowed else self._allowed.discard)(session_id)
        if not allowed:
            super().remove_session_files(session_id)


def _manager() -> GuardedUploadedFileManager | None:
    """The running server's upload store, guarded from now on; None outside a server (AppTest, bare mode)."""
    from streamlit.runtime import Runtime

    if not Runtime.exists():
        return None
    mgr = Runtime.instance().uploaded_file_mgr  # the object the upload route holds (starlette_app.py)
    if isinstance(mgr, GuardedUploadedFileManager):
        return mgr
    if type(mgr) is not MemoryUploadedFileManager:  # another store: not ours to change
        return None
    with _install_lock:
        if not isinstance(mgr, GuardedUploadedFileManager):
            with mgr._lock:
                mgr._allowed = set()
                # what was put before the first page ran anywhere (between a session's first message and its gate)
                # came from no allowed session: dropped
                mgr.file_storage.clear()
                mgr._total_bytes = mgr._file_count = 0
                mgr.__class__ = GuardedUploadedFileManager
    return mgr  # type: ignore[return-value]


def _session_id() -> str | None:
    from streamlit.runtime.scriptrunner_utils.script_run_context import get_script_run_ctx

    ctx = get_script_run_ctx()
    return ctx.session_id if ctx is not None else None


def allow() -> None:
    """This session's page may draw: it may upload (within the quota)."""
    mgr, sid = _manager(), _session_id()
    if mgr is not None and sid is not None:
        mgr.set_allowed(sid, True)


def refuse() -> None:
    """This session shows only the sign-in prompt or an error: it may not upload, and what it held is dropped."""
    mgr, sid = _manager(), _session_id()
    if mgr is not None and sid is not None:
        mgr.set_allowed(sid, False)
