"""Who may see the dashboard: Streamlit's built-in OIDC sign-in when the host configures ``[auth]``.

A team dashboard is not for everyone on the network. When ``.streamlit/secrets.toml`` (or any secrets source
Streamlit reads) has an ``[auth]`` section, every page shows only a sign-in prompt until ``st.user.is_logged_in``
(``st.login`` redirects to the identity provider: Google, Microsoft Entra, Okta, Keycloak, Auth0...). Without
``[auth]`` the dashboard stays open, as it is for local use. ``page.setup`` calls ``gate`` first, so no page can
forget it. See README, "Hosting" > "Sign-in".

``[auth]`` holds either one provider (``client_id``, ``client_secret``, ``server_metadata_url`` next to
``redirect_uri`` and ``cookie_secret``: ``st.login()``) or one sub-table per provider (``[auth.google]``,
``[auth.okta]``: one button each, ``st.login("google")``).
"""
from __future__ import annotations

from collections.abc import Mapping

import streamlit as st
from streamlit.errors import StreamlitAuthError

from batching.ui.safe import plain

PROMPT = "This team dashboard asks you to sign in first."


def auth_section() -> Mapping | None:
    """The ``[auth]`` secrets section, or None when the host configured none (the dashboard is open)."""
    try:
        section = st.secrets.get("auth")
    except FileNotFoundError:  # no secrets file at all (StreamlitSecretNotFoundError is one)
        return None
    return section if isinstance(section, Mapping) and len(section) else None


def providers(section: Mapping) -> list[str | None]:
    """The providers to offer: None for a single provider configured directly under ``[auth]``, then one name
    per ``[auth.<name>]`` sub-table."""
    named = sorted(k for k, v in section.items() if isinstance(v, Mapping) and k != "client_kwargs")
    return ([None] if "client_id" in section or not named else []) + named


def signed_in() -> bool:
    return bool(st.user.get("is_logged_in", False))


def gate() -> bool:
    """True when the page may draw. Otherwise draw only the sign-in prompt and return False (the caller stops)."""
    section = auth_section()
    if section is None or signed_in():
        return True
    st.title("Batching explorer")
    st.info(PROMPT, icon=":material/lock:")
    for name in providers(section):
        label = "Sign in" if name is None else f"Sign in with {plain(name.replace('_', ' ').title())}"
        if st.button(label, key=f"sign_in_{name or 'default'}", type="primary", icon=":material/login:"):
            try:
                st.login() if name is None else st.login(name)
            except StreamlitAuthError as exc:  # the host's [auth] section is incomplete
                st.error(f"**Sign-in is not configured correctly on this server:** {plain(exc)}",
                         icon=":material/error:")
    return False


def account_box() -> None:
    """In the sidebar of a signed-in session: who is signed in, and a button to sign out."""
    if auth_section() is None or not signed_in():
        return
    who = st.user.get("name") or st.user.get("email") or "signed in"
    with st.sidebar:
        st.divider()
        st.caption(f"Signed in as {plain(who)}")  # the identity provider's claim: shown as typed
        if st.button("Sign out", key="sign_out", icon=":material/logout:", width="stretch"):
            st.logout()
