"""Sign-in: with [auth] in the secrets every page shows only the sign-in prompt until the user is signed in;
without it the dashboard stays open."""
from __future__ import annotations

import pytest
from uihelpers import FAST, assert_clean, drawn_charts, open_page

from batching.ui import access, nav
from batching.ui.safe import plain

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
