"""Issue 39 item 13, against a running server on 127.0.0.1: a visitor on the sign-in prompt cannot leave files on the
server (each PUT with the page's own XSRF token is refused and the server's memory stays put), and a session whose
page draws holds at most twice the upload limit. No simulation runs: the signed-out pages stop at the prompt and the
open server's session uploads once its page has passed the gate (it closes before the page's run ends). About 40 s."""
from __future__ import annotations

import asyncio
from stclient import Session, rss_mib
from streamlit_server import StreamlitServer

from batching.ui import access, upload_guard

AUTH = ('[auth]\nredirect_uri = "http://127.0.0.1:8501/oauth2callback"\ncookie_secret = "' + "x" * 32 + '"\n'
        'client_id = "dashboard"\nclient_secret = "s"\n'
        'server_metadata_url = "https://idp.example.com/.well-known/openid-configuration"\n')
FILE_MB = 40
FILES = 4  # 160 MB offered by a visitor who has not signed in
GROWTH_LIMIT_MIB = 60  # one refused body is read (then freed) at a time; held files would add 160 MiB


def _uploaded_bytes(url: str) -> int:
    """What the server's upload store holds (Streamlit's own metric), bytes."""
    import urllib.request

    with urllib.request.urlopen(f"{url}/_stcore/metrics", timeout=10) as r:
        text = r.read().decode()
    return sum(int(float(line.rsplit(" ", 1)[1])) for line in text.splitlines()
               if line.startswith("cache_memory_bytes") and 'cache_type="UploadedFileManager"' in line)


async def _signed_out_uploads(server: StreamlitServer) -> tuple[list[int], float, float]:
    session = await Session(server.url).open()
    try:
        assert access.PROMPT in session.texts, session.texts  # the visitor sees only the sign-in prompt
        before = rss_mib(server.proc.pid)
        data = b"0" * (FILE_MB * 1024 * 1024)
        statuses = [await asyncio.to_thread(session.put, data) for _ in range(FILES)]
        del data
        await asyncio.sleep(1.0)
        return statuses, before, rss_mib(server.proc.pid)
    finally:
        await session.close()


def test_a_visitor_on_the_sign_in_prompt_cannot_leave_files(tmp_path):
    secrets = tmp_path / "secrets.toml"
    secrets.write_text(AUTH)
    with StreamlitServer("uploads-signed-out.log", args=["--secrets.files", str(secrets)]) as server:
        statuses, before, after = asyncio.run(_signed_out_uploads(server))
        held = _uploaded_bytes(server.url)
    print(f"\nsigned-out uploads {FILES} x {FILE_MB} MB: statuses {statuses}, RSS {before:.0f} -> {after:.0f} MiB, "
          f"store holds {held} bytes")
    assert statuses == [403] * FILES, statuses
    assert held == 0
    assert after - before < GROWTH_LIMIT_MIB, (before, after)


async def _open_session_uploads(server: StreamlitServer, limit_mb: int) -> tuple[list[int], int]:
    # the home page draws its title once the gate let it through (then it simulates; the session closes first)
    session = await Session(server.url).open(until="Strategy showdown")
    try:
        assert "Strategy showdown" in session.texts, session.texts
        statuses = [await asyncio.to_thread(session.put, b"1" * (limit_mb * 1024 * 1024 - 4096))
                    for _ in range(upload_guard.MAX_FILES + 2)]
        return statuses, await asyncio.to_thread(_uploaded_bytes, server.url)  # while the session holds them
    finally:
        await session.close()


def test_a_session_holds_at_most_twice_the_upload_limit(tmp_path):
    limit_mb = 2
    absent = tmp_path / "none" / "secrets.toml"  # no sign-in configured: the dashboard is open
    with StreamlitServer("uploads-quota.log", args=["--secrets.files", str(absent),
                                                    "--server.maxUploadSize", str(limit_mb)]) as server:
        statuses, held = asyncio.run(_open_session_uploads(server, limit_mb))
    print(f"\nopen session: {len(statuses)} uploads of ~{limit_mb} MB: {statuses}, store holds {held} bytes")
    assert statuses == [204] * (upload_guard.MAX_FILES + 2), statuses  # a page that draws may upload
    assert 0 < held <= upload_guard.QUOTA_FACTOR * limit_mb * 1024 * 1024, held
