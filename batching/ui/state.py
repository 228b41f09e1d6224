"""Values that live in the URL and in the session: load from the link, bind to widgets, publish back.

Each value has a store key in ``st.session_state`` (kept across pages and reruns) and a widget
key. The URL wins on the run where it changed (a pasted link); otherwise the session does.
Widgets copy their new value to the store in an ``on_change`` callback, before the rerun.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any
from urllib.parse import urlencode

import streamlit as st

from batching.ui.params import Param
from batching.ui.safe import plain

_STORE = "val:"
_WIDGET = "wid:"
_SEEN = "_url_seen"  # key -> URL text last read or written
_NOTICES = "_url_notices"


def store_key(key: str) -> str:
    return _STORE + key


def widget_key(key: str) -> str:
    return _WIDGET + key


def value(key: str, default: Any = None) -> Any:
    return st.session_state.get(store_key(key), default)


def set_value(key: str, new: Any) -> None:
    st.session_state[store_key(key)] = new


def load(params: Iterable[Param]) -> list[str]:
    """Bring the URL's values into the session; returns notices for values that were corrected."""
    ss = st.session_state
    seen = ss.setdefault(_SEEN, {})
    notices = []
    for p in params:
        raw = st.query_params.get(p.key)
        sk = store_key(p.key)
        if raw is not None and raw != seen.get(p.key):
            new, note = p.parse(raw)
            seen[p.key] = raw
            ss[sk] = new
            if note:
                notices.append(note)
        elif sk not in ss:
            ss[sk] = p.default
        else:
            ss[sk] = p.clamp(ss[sk])  # the allowed range may have moved (another model, another preset)
    if notices:
        ss[_NOTICES] = list(dict.fromkeys([*ss.get(_NOTICES, []), *notices]))
    return notices


def load_with_notices(params: Iterable[Param]) -> None:
    """``load``, showing a warning for each value the link had to correct (for values drawn after the sidebar)."""
    for note in load(params):
        st.warning(plain(note), icon=":material/link:")  # quotes the link: plain text


def notices() -> list[str]:
    return list(st.session_state.get(_NOTICES, []))


def clear_notices() -> None:
    st.session_state.pop(_NOTICES, None)


def _copy_to_store(key: str) -> None:
    st.session_state[store_key(key)] = st.session_state[widget_key(key)]
    clear_notices()


def bind(key: str) -> dict:
    """Widget keyword arguments: a key preset from the stored value and a callback that stores changes."""
    st.session_state[widget_key(key)] = st.session_state[store_key(key)]
    return {"key": widget_key(key), "on_change": _copy_to_store, "args": (key,)}


def publish(params: Iterable[Param]) -> None:
    """Write values that differ from their default to the URL; drop the rest."""
    seen = st.session_state.setdefault(_SEEN, {})
    for p in params:
        current = st.query_params.get(p.key)
        new = value(p.key)
        text = None if new == p.default else p.encode(new)
        if text is None:
            if current is not None:
                del st.query_params[p.key]
        elif current != text:
            st.query_params[p.key] = text
        seen[p.key] = text


def drop(keys: Iterable[str]) -> None:
    """Remove values that no longer apply (e.g. knobs of another mode) from the URL."""
    seen = st.session_state.setdefault(_SEEN, {})
    for key in keys:
        if key in st.query_params:
            del st.query_params[key]
        seen[key] = None


def reset(params: Sequence[Param]) -> None:
    """Defaults for these values (a callback; the next publish cleans the URL)."""
    for p in params:
        set_value(p.key, p.default)
    clear_notices()


def url_params(params: Iterable[Param]) -> dict[str, str]:
    """The non-default values of these params as URL text (for links to other pages)."""
    out = {}
    for p in params:
        v = value(p.key, p.default)
        if v != p.default:
            out[p.key] = p.encode(v)
    return out


def current_link() -> str:
    """A link to this view: the page URL with the current query string."""
    query = urlencode(st.query_params.to_dict())
    try:
        base = st.context.url or ""
    except Exception:  # no browser context (tests, bare mode)
        base = ""
    return f"{base}?{query}" if query else (base or "?")
