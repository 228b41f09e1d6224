"""Who may see the dashboard: Streamlit's built-in OIDC sign-in when the host configures ``[auth]``.

A team dashboard is not for everyone on the network. When ``.streamlit/secrets.toml`` (or any secrets source
Streamlit reads) has an ``[auth]`` section, every page shows only a sign-in prompt until ``st.user.is_logged_in``
(``st.login`` redirects to the identity provider: Google, Microsoft Entra, Okta, Keycloak, Auth0...). Without
``[auth]`` the dashboard stays open, as it is for local use. ``page.setup`` calls ``gate`` first, so no page can
forget it. See README, "Hosting" > "Sign-in".

``[auth]`` holds either one provider (``client_id``, ``client_secret``, ``server_metadata_url`` next to
``redirect_uri`` and ``cookie_secret``: ``st.login()``) or one sub-table per provider (``[auth.google]``,
``[auth.okta]``: one button each, ``st.login("google")``).

Sign-in fails closed. Streamlit treats a secrets file it cannot parse like no file at all (it logs one line and
the dashboard would be open to everyone), and it checks ``[auth]`` only when someone presses "Sign in". So
``gate`` first reads every file Streamlit would (its ``secrets.files`` option: ``~/.streamlit/secrets.toml``,
``<cwd>/.streamlit/secrets.toml`` and the one next to ``app.py``) and checks the ``[auth]`` section as
``st.login`` would; when a file cannot be read or parsed, or ``[auth]`` lacks what ``st.login`` needs, every page
shows only an error naming the file and line, until the host fixes the file (it is read again on each run).
"""
from __future__ import annotations

import difflib
import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path

import streamlit as st
from streamlit import config
from streamlit.errors import StreamlitAuthError

from batching.ui import upload_guard
from batching.ui.safe import plain

PROMPT = "This team dashboard asks you to sign in first."
BROKEN = "Sign-in is configured wrongly on this server, so the dashboard shows nothing until the host fixes it"
# what st.login needs (streamlit.auth_util.validate_auth_credentials): two keys in [auth], three per provider
SECTION_KEYS = ("redirect_uri", "cookie_secret")
LAUNCH_PROBLEM_ENV = "BATCHING_SECRETS_PROBLEM"  # set by batching.ui.serve only
PROVIDER_KEYS = ("client_id", "client_secret", "server_metadata_url")
_AUTH_HEADER = re.compile(r"^[ \t]*\[[ \t]*auth[ \t]*[.\]]|^[ \t]*auth[ \t]*[.=]", re.MULTILINE)


def auth_problem(section: Mapping) -> str | None:
    """What ``st.login`` would refuse in an ``[auth]`` section (a key missing or empty, a provider name with
    ``_``), or None when it is complete. An empty section configures no sign-in (None)."""
    if not len(section):
        return None
    for key in (*SECTION_KEYS, *PROVIDER_KEYS):  # a number or a table where st.login needs a string
        for name, where in (("[auth]", section), *((f"[auth.{n}]", section[n]) for n in providers(section) if n)):
            value = where.get(key)
            if value is not None and not isinstance(value, str):
                return f"{name}: {key} must be a quoted string, not {type(value).__name__} {value!r}"
    missing = [k for k in SECTION_KEYS if not section.get(k)]
    for name in providers(section):
        where = section if name is None else section[name]
        lacks = [k for k in PROVIDER_KEYS if not where.get(k)]
        label = "[auth]" if name is None else f"[auth.{name}]"
        if name is not None and "_" in name:
            return f"{label}: st.login refuses provider names with '_'"
        missing += [f"{k} (in {label})" if name is not None else k for k in lacks]
    if missing:
        return (f"[auth] lacks {', '.join(missing)}; sign-in needs {' and '.join(SECTION_KEYS)} in [auth] and "
                f"{', '.join(PROVIDER_KEYS)} for each provider (README, Hosting > Sign-in)")
    return None


def _auth_line(text: str) -> int | None:
    """The line of a TOML file where its ``[auth]`` section (or an ``auth.`` key) starts."""
    found = _AUTH_HEADER.search(text)
    return text.count("\n", 0, found.start()) + 1 if found else None


def misspelt_auth(parsed: Mapping) -> str | None:
    """The name of a top-level table that was meant as ``[auth]`` but is not read as it (``[Auth]``, ``[AUTH]``,
    ``[auht]``, ``[oauth]``, or any table holding ``redirect_uri`` or ``cookie_secret``); ``"auth keys"`` when those keys
    sit at the top level, without the ``[auth]`` header. None when nothing looks like a misspelt sign-in section."""
    if "auth" in parsed:
        return None
    for key, value in parsed.items():
        near = difflib.get_close_matches(key.strip().lower(), ["auth"], n=1, cutoff=0.75)
        if isinstance(value, Mapping) and (near or any(k in value for k in SECTION_KEYS)):
            return key
    if any(k in parsed for k in SECTION_KEYS):
        return "auth keys"
    return None


def _line_of(text: str, key: str) -> int | None:
    """The first line of a TOML file that names ``key`` as a table or a key (for the error's pointer)."""
    if key == "auth keys":
        key = next(k for k in SECTION_KEYS if k in text)
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip().lstrip("[").strip()
        if stripped.startswith(key) or stripped.startswith(f'"{key}"'):
            return number
    return None


def launch_problem() -> str | None:
    """The problem ``batching.ui.serve`` found in the secrets before it started the server (it then starts it
    without them, so that Streamlit does not exit at start-up), or None."""
    return os.environ.get(LAUNCH_PROBLEM_ENV) or None


def secrets_problem() -> str | None:
    """Why the host's secrets cannot say whether sign-in is on (a file Streamlit reads that cannot be read or
    parsed, a misspelt or wrongly typed ``[auth]``, or an incomplete one), naming the file and line; None when they
    can (or there are none)."""
    launched = launch_problem()
    if launched is not None:
        return f"{launched} (fix the file, then restart the service)"
    auth_file: tuple[str, str] | None = None  # the last file with [auth]: its section wins (Streamlit merges files)
    found = False
    for name in config.get_option("secrets.files"):
        path = Path(name)
        if not name.endswith(".toml"):  # a Kubernetes-style folder: Streamlit's own parse checks it below
            found = found or path.exists()
            continue
        try:
            text = path.read_bytes().decode("utf-8")
        except FileNotFoundError:
            continue
        except (OSError, UnicodeDecodeError) as exc:
            return f"{name} cannot be read: {exc}"
        found = True
        try:
            parsed = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:  # its message ends "(at line L, column C)"
            return f"{name} is not valid TOML: {exc}"
        misspelt = misspelt_auth(parsed)
        if misspelt is not None:
            line = _line_of(text, misspelt)
            return (f"{name}{f', line {line}' if line else ''}: [{misspelt}] is not read as sign-in settings "
                    "(Streamlit reads only [auth], in lower case), so the dashboard would be open to everyone; "
                    "rename it [auth], or remove it to run without sign-in")
        if "auth" in parsed and not isinstance(parsed["auth"], Mapping):
            return (f"{name}, line {_auth_line(text) or '?'}: auth must be a table ([auth] with its keys), "
                    f"not {type(parsed['auth']).__name__} {parsed['auth']!r}")
        if "auth" in parsed:
            auth_file = (name, text)
    if found:
        try:  # what Streamlit itself makes of them (folders, types): it must load when anything is there
            st.secrets.get("auth")
        except Exception as exc:  # noqa: BLE001 (any failure here would leave sign-in off)
            return f"Streamlit cannot load the secrets: {exc}"
    section = auth_section()
    problem = auth_problem(section) if section is not None else None
    if problem is None:
        return None
    if auth_file is None:
        return problem
    line = _auth_line(auth_file[1])
    return f"{auth_file[0]}{f', line {line}' if line else ''}: {problem}"


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
    """True when the page may draw. Otherwise draw only the sign-in prompt, or the error that says why sign-in
    cannot work (``secrets_problem``), and return False (the caller stops)."""
    problem = secrets_problem()
    if problem is not None:
        upload_guard.refuse()
        st.title("Batching explorer")
        st.error(f"**{BROKEN}:** {plain(problem)}", icon=":material/error:")
        return False
    section = auth_section()
    if section is None or signed_in():
        upload_guard.allow()
        return True
    upload_guard.refuse()  # a visitor on the sign-in prompt leaves no file on the server
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
