"""Sign-in: with [auth] in the secrets every page shows only the sign-in prompt until the user is signed in;
without it the dashboard stays open."""
from __future__ import annotations

import pytest
from uihelpers import FAST, assert_clean, drawn_charts, open_page

from batching.ui import access, nav
from batching.ui.safe import plain, unescape

ONE_PROVIDER = {"auth": {"redirect_uri": "http://localhost:8501/oauth2callback", "cookie_secret": "x" * 32,
                         "client_id": "dashboard", "client_secret": "s",
                         "server_metadata_url": "https://idp.example.com/.well-known/openid-configuration"}}
TWO_PROVIDERS = {"auth": {"redirect_uri": "http://localhost:8501/oauth2callback", "cookie_secret": "x" * 32,
                          "google": {"client_id": "g", "client_secret": "s",
                                     "server_metadata_url": "https://accounts.google.com/.well-known/openid-configuration"},
                          "okta": {"client_id": "o", "client_secret": "s",
                                   "server_metadata_url": "https://x.okta.com/.well-known/openid-configuration"}}}
# what a signed-out visitor must not see, even when the link asks for it
HOSTILE = {"gpu": "![p](http://host/p.png)", **FAST}


def _leaves(block) -> list[str]:
    out = []
    for child in block.children.values():
        out += _leaves(child) if getattr(child, "children", None) else [child.type]
    return out


def _elements(at) -> list[str]:
    """Every element of the main area and the sidebar, by type (widgets and text alike)."""
    return [t for t in _leaves(at.main) if t != "html"] + _leaves(at.sidebar)  # the page's CSS is not content


@pytest.mark.parametrize("page", [p.path for p in nav.PAGES])
def test_every_page_shows_only_the_sign_in_prompt_when_signed_out(page):
    at = open_page(page, **HOSTILE)
    at.secrets = dict(ONE_PROVIDER)
    at.user = {}  # no session cookie: not signed in
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert [t.value for t in at.title] == ["Batching explorer"]
    assert [i.value for i in at.info] == [access.PROMPT]
    assert [b.label for b in at.button] == ["Sign in"]
    # nothing else: no sidebar, no scenario, no notice about the link, no charts, tables or metrics
    assert not _leaves(at.sidebar)
    assert sorted(_elements(at)) == sorted(["title", "info", "button"]), _elements(at)
    assert not at.warning and not at.error and not drawn_charts(at) and not at.dataframe and not at.metric


def test_one_button_per_configured_provider():
    at = open_page("app.py", **FAST)
    at.secrets = dict(TWO_PROVIDERS)
    at.user = {}
    at.run()
    assert not at.exception
    assert [b.label for b in at.button] == ["Sign in with Google", "Sign in with Okta"]


def test_signed_in_user_sees_the_page_and_a_sign_out_button():
    at = open_page("app.py", **FAST)
    at.secrets = dict(ONE_PROVIDER)
    at.user = {"is_logged_in": True, "email": "ada@example.com", "name": "Ada [admin](https://evil.example)"}
    at.run()
    assert_clean(at)
    assert at.title[0].value == "Strategy showdown" and at.dataframe
    assert not [i for i in at.info if i.value == access.PROMPT]
    assert at.sidebar.button(key="sign_out").label == "Sign out"
    who = [c.value for c in at.sidebar.caption if c.value.startswith("Signed in as")]
    assert who == ["Signed in as " + plain("Ada [admin](https://evil.example)")]  # the IdP's claim, as typed


def test_without_auth_the_dashboard_stays_open():
    at = open_page("app.py", **FAST)
    at.user = {}
    at.run()
    assert_clean(at)
    assert at.title[0].value == "Strategy showdown" and at.dataframe
    assert not [b for b in at.button if b.label.startswith("Sign")]


# ---- fail closed: a secrets file that cannot be read or parsed, or an [auth] section st.login cannot use ----

@pytest.fixture(autouse=True)
def no_secrets_left_behind():
    """Streamlit's own code (st.login's checks) reads the process-wide secrets store, which caches what it parsed:
    clear it after every test here, or a temporary file's [auth] would gate every page the later tests open."""
    yield
    from streamlit.runtime.secrets import secrets_singleton

    secrets_singleton._reset()


@pytest.fixture
def secrets_files(tmp_path):
    """Point Streamlit's ``secrets.files`` at one file under tmp_path (written by the test), as a host's
    ``.streamlit/secrets.toml`` would be; a fresh ``st.secrets`` store so nothing parsed leaks into other tests."""
    import streamlit as st
    from streamlit.runtime.secrets import Secrets
    from streamlit.testing.v1.util import patch_config_options

    path = tmp_path / ".streamlit" / "secrets.toml"
    path.parent.mkdir()
    saved = st.secrets
    st.secrets = Secrets()
    st.secrets._file_watchers_installed = True  # no polling thread on a temporary file
    with patch_config_options({"secrets.files": [str(tmp_path / "absent" / "secrets.toml"), str(path)]}):
        yield path
    st.secrets = saved


BROKEN = '# sign-in\n[auth\nredirect_uri = "http://localhost:8501/oauth2callback"\n'  # missing bracket, line 2


def _only_the_error(at) -> str:
    """The page drew its heading and one error, nothing else (no sidebar, no widget, no chart); the error's text."""
    assert not at.exception, [e.value for e in at.exception]
    assert [t.value for t in at.title] == ["Batching explorer"]
    assert not _leaves(at.sidebar)
    assert sorted(_elements(at)) == ["error", "title"], _elements(at)
    assert not drawn_charts(at) and not at.button and not at.dataframe and not at.metric
    return unescape(at.error[0].value)


@pytest.mark.parametrize("page", [p.path for p in nav.PAGES])
def test_every_page_serves_only_an_error_when_the_secrets_file_does_not_parse(page, secrets_files):
    secrets_files.write_text(BROKEN)
    at = open_page(page, **HOSTILE)
    at.user = {}
    at.run()
    text = _only_the_error(at)
    assert str(secrets_files) in text and "line 2, column" in text, text


@pytest.mark.parametrize("page", [p.path for p in nav.PAGES])
def test_every_page_serves_only_an_error_when_auth_is_incomplete(page):
    at = open_page(page, **HOSTILE)
    at.secrets = {"auth": {k: v for k, v in ONE_PROVIDER["auth"].items() if k != "cookie_secret"}}
    at.user = {"is_logged_in": True, "email": "ada@example.com"}  # even a session that says it is signed in
    at.run()
    text = _only_the_error(at)
    assert "cookie_secret" in text, text


def _problem(auth: dict) -> str | None:
    return access.auth_problem(auth)


@pytest.mark.parametrize("auth, missing", [
    ({}, None),  # an empty [auth] is no sign-in configured: open, as without it
    ({"redirect_uri": "u"}, "cookie_secret"),
    ({k: v for k, v in ONE_PROVIDER["auth"].items() if k != "client_secret"}, "client_secret"),
    ({**ONE_PROVIDER["auth"], "server_metadata_url": ""}, "server_metadata_url"),  # empty is missing
    ({"redirect_uri": "u", "cookie_secret": "c"}, "client_id"),  # no provider at all
    ({"redirect_uri": "u", "cookie_secret": "c", "okta": {"client_id": "o", "client_secret": "s"}},
     "server_metadata_url"),
    ({**TWO_PROVIDERS["auth"], "my_idp": dict(TWO_PROVIDERS["auth"]["okta"])}, "my_idp"),  # st.login refuses "_"
])
def test_an_incomplete_auth_section_is_named(auth, missing):
    problem = _problem(auth)
    if missing is None:
        assert problem is None
    else:
        assert problem is not None and missing in problem, problem


def test_complete_auth_sections_are_accepted():
    assert _problem(dict(ONE_PROVIDER["auth"])) is None
    assert _problem(dict(TWO_PROVIDERS["auth"])) is None


def test_a_file_that_is_not_utf8_is_refused_by_name(secrets_files):
    secrets_files.write_bytes(b'[auth]\nredirect_uri = "\xff"\n')
    problem = access.secrets_problem()
    assert problem is not None and str(secrets_files) in problem, problem


def test_an_incomplete_auth_in_a_file_names_the_file_and_the_line(secrets_files):
    secrets_files.write_text('title = "x"\n\n[auth]\nredirect_uri = "u"\nclient_id = "c"\n')
    problem = access.secrets_problem()
    assert problem is not None, problem
    assert str(secrets_files) in problem and "line 3" in problem and "cookie_secret" in problem, problem


def test_a_valid_file_with_auth_shows_the_sign_in_prompt(secrets_files):
    import tomllib
    secrets_files.write_text('[auth]\n' + "".join(f'{k} = "{v}"\n' for k, v in ONE_PROVIDER["auth"].items()))
    assert tomllib.loads(secrets_files.read_text()) == ONE_PROVIDER
    assert access.secrets_problem() is None
    at = open_page("app.py", **FAST)
    at.user = {}
    at.run()
    assert not at.exception and not at.error
    assert [i.value for i in at.info] == [access.PROMPT]


def test_no_secrets_file_and_a_file_without_auth_leave_the_dashboard_open(secrets_files):
    assert access.secrets_problem() is None  # no file at either path
    secrets_files.write_text('other = "value"\n')
    assert access.secrets_problem() is None and access.auth_section() is None


def test_a_secrets_folder_streamlit_cannot_load_is_refused(tmp_path):
    """``secrets.files`` may name a Kubernetes-style folder: one Streamlit refuses (a file where a folder must be)
    would turn its secrets, [auth] included, off; the page names it instead."""
    import streamlit as st
    from streamlit.runtime.secrets import Secrets
    from streamlit.testing.v1.util import patch_config_options

    folder = tmp_path / "secrets"
    folder.mkdir()
    (folder / "stray.txt").write_text("x")
    saved, st.secrets = st.secrets, Secrets()
    try:
        with patch_config_options({"secrets.files": [str(folder)]}):
            problem = access.secrets_problem()
    finally:
        st.secrets = saved
    assert problem is not None and "stray.txt" in problem, problem


@pytest.mark.parametrize("parsed, misspelt", [
    ({"Auth": dict(ONE_PROVIDER["auth"])}, "Auth"),
    ({"AUTH": {"redirect_uri": "u"}}, "AUTH"),
    ({"auht": {}}, "auht"),
    ({"signin": {"cookie_secret": "c"}}, "signin"),  # any table holding [auth]'s own keys
    ({"cookie_secret": "c", "redirect_uri": "u"}, "auth keys"),  # the keys without their [auth] header
    ({"authors": {"name": "x"}, "author": "x", "db": {"password": "p"}}, None),  # other secrets are left alone
    ({**ONE_PROVIDER, "Auth": {}}, None),  # [auth] itself is there: it is what Streamlit reads
])
def test_a_misspelt_auth_section_is_found(parsed, misspelt):
    assert access.misspelt_auth(parsed) == misspelt


def test_a_misspelt_section_in_a_file_names_the_file_and_line(secrets_files):
    secrets_files.write_text('title = "x"\n\n[Auth]\nredirect_uri = "u"\n')
    problem = access.secrets_problem()
    assert problem is not None and str(secrets_files) in problem and "line 3" in problem, problem


def test_a_secret_that_is_not_a_string_is_named():
    problem = access.auth_problem({**ONE_PROVIDER["auth"], "cookie_secret": 12345})
    assert problem is not None and "cookie_secret" in problem and "12345" in problem, problem
