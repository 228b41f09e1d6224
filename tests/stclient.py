"""A minimal Streamlit client for tests against a running server (tests/streamlit_server.py): opens a session over the
WebSocket as the browser does (its own XSRF cookie and token, as any visitor can), runs the page once, and PUTs
files to ``/_stcore/upload_file/<session>/<file>`` as the file uploader does. Loopback only."""
from __future__ import annotations

import asyncio
import http.client
import uuid
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import websockets
from streamlit.proto.BackMsg_pb2 import BackMsg
from streamlit.proto.ForwardMsg_pb2 import ForwardMsg
from streamlit.web.server.starlette.starlette_app_utils import generate_xsrf_token_string

RUN_TIMEOUT_S = 60


@dataclass
class Session:
    base: str  # http://127.0.0.1:port
    xsrf: str = field(default_factory=generate_xsrf_token_string)
    session_id: str = ""
    texts: list[str] = field(default_factory=list)  # every alert, title and markdown body the run drew
    ws: object = None

    async def open(self, query: str = "", cookies: str = "", page: str = "", until: str | None = None) -> "Session":
        """Connect and run a page (``page``: its name, e.g. "explore"; the home page when empty) until the script
        finishes, or until it has drawn a text that contains ``until``; the connection stays open."""
        url = "ws://" + urlsplit(self.base).netloc + "/_stcore/stream"
        headers = {"Cookie": f"_streamlit_xsrf={self.xsrf}" + (f"; {cookies}" if cookies else "")}
        self.ws = await websockets.connect(url, subprotocols=["streamlit", self.xsrf],
                                           additional_headers=headers, max_size=None)
        msg = BackMsg()
        msg.rerun_script.query_string = query
        msg.rerun_script.page_name = page
        await self.ws.send(msg.SerializeToString())
        async with asyncio.timeout(RUN_TIMEOUT_S):
            while True:
                fwd = ForwardMsg()
                fwd.ParseFromString(await self.ws.recv())
                kind = fwd.WhichOneof("type")
                if kind == "new_session":
                    self.session_id = fwd.new_session.initialize.session_id
                elif kind == "delta" and fwd.delta.WhichOneof("type") == "new_element":
                    el = fwd.delta.new_element
                    which = el.WhichOneof("type")
                    if which == "alert":
                        self.texts.append(el.alert.body)
                    elif which in ("heading", "markdown"):
                        self.texts.append(getattr(el, which).body)
                if kind == "script_finished" or (until is not None and any(until in t for t in self.texts)):
                    return self

    async def close(self) -> None:
        if self.ws is not None:
            await self.ws.close()

    def put(self, data: bytes, name: str = "trace.csv", file_id: str | None = None,
            cookies: str = "", base: str | None = None) -> int:
        """PUT one file as the uploader does; the HTTP status (``base``: through another host, e.g. a proxy)."""
        return upload(base or self.base, self.session_id, data, self.xsrf, name, file_id, cookies)


def upload(base: str, session_id: str, data: bytes, xsrf: str, name: str = "trace.csv",
           file_id: str | None = None, cookies: str = "") -> int:
    return upload_response(base, session_id, data, xsrf, name, file_id, cookies)[0]


def upload_response(base: str, session_id: str, data: bytes, xsrf: str, name: str = "trace.csv",
                    file_id: str | None = None, cookies: str = "") -> tuple[int, bytes]:
    """PUT one file; the HTTP status and the response's body (0 and b"" when the server closed mid-send)."""
    boundary = uuid.uuid4().hex
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{name}\"\r\n"
            f"Content-Type: text/csv\r\n\r\n").encode() + data + f"\r\n--{boundary}--\r\n".encode()
    parts = urlsplit(base)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    try:
        conn.request("PUT", f"/_stcore/upload_file/{session_id}/{file_id or uuid.uuid4()}", body=body, headers={
            "Content-Type": f"multipart/form-data; boundary={boundary}", "X-Xsrftoken": xsrf,
            "Cookie": f"_streamlit_xsrf={xsrf}" + (f"; {cookies}" if cookies else "")})
        resp = conn.getresponse()
        return resp.status, resp.read()
    except (ConnectionError, http.client.HTTPException):  # a server that refuses a body may close mid-send
        return 0, b""
    finally:
        conn.close()


def rss_mib(pid: int) -> float:
    """Resident memory of a process (Linux), MiB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")
