"""User-supplied text on screen: shown exactly as typed, never as Markdown.

Streamlit escapes raw HTML but renders Markdown in ``st.warning``/``st.error``/``st.info``/``st.caption``/
``st.markdown`` and in ``help`` tooltips, so a shared link ``/?gpu=![p](http://host/p.png)`` would make every
visitor's browser fetch that image, and ``[Log in again](https://...)`` would draw a link inside the app's own
warning box. Every text a user controls (URL query values, uploaded file names, trace columns and cells, class
names, custom spec names, an identity provider's user name, and library error messages that quote them) goes
through ``plain`` before it reaches one of those elements; ``st.text``/``st.code`` need nothing.

``plain`` backslash-escapes (CommonMark lets any ASCII punctuation be escaped; the escape renders as the
character) every character that can start a construct inside a line of text:

- links, images and footnotes need ``[``/``]``, images ``!``; autolinks ``<scheme:...>`` and ``<a@b.c>`` need
  ``:`` or ``@`` (the dot after ``www`` is escaped too);
- emphasis and strikethrough ``*``, ``~``, and ``_`` where it can delimit (``_`` inside a word, as in
  ``prompt_tokens``, never does, so it stays as typed); code spans `````; entities ``&``; tables ``|``;
  headings ``#``; Streamlit's ``:red[...]``, ``:material/icon:`` and ``$LaTeX$`` (``:`` and ``$``); ``\\``;
- raw HTML (``<``, ``>``) is escaped by Streamlit already.

Escapes are not enough for GFM's bare links: remark-gfm also turns ``https://...``, ``www.x`` and ``a@b.c`` found
in the text *after* escapes are read into links (checked in Chromium: ``https\\://evil.io`` still became one). So
``plain`` also puts an invisible WORD JOINER (U+2060) after every ``:`` and ``@`` and between ``www`` and its dot,
which those patterns cannot cross; it also keeps Streamlit's ``:material/icon:`` and ``:emoji:`` shortcodes as
text. The text reads the same; a copied URL carries the joiner (it will not open by accident).

Line breaks and other control characters become spaces, so user text never starts a line and block constructs
(lists, quotes, headings, setext underlines, indented code) cannot form. Everything else (``( ) . , ' " = - /``)
stays as typed, so messages keep reading naturally. No Streamlit import here.
"""
from __future__ import annotations

import re

_ALWAYS = r"\\`*~\[\]!:@$#|&"
_ESCAPE = re.compile(rf"([{_ALWAYS}])|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])|(?i:(?<=www)\.)")
_CONTROL = re.compile(r"[\x00-\x1f\x7f\u0085\u2028\u2029]+")
_ESCAPED = re.compile(r"\\([!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~])")
JOINER = "\u2060"  # WORD JOINER: invisible, breaks the bare-link patterns
_JOIN = re.compile(r"(?<=[:@])|(?i:(?<=www)(?=\\\.))")


def plain(text: object) -> str:
    """Markdown source that Streamlit renders as exactly ``str(text)`` (control characters as spaces)."""
    escaped = _ESCAPE.sub(lambda m: "\\" + m.group(0), _CONTROL.sub(" ", str(text)))
    return _JOIN.sub(JOINER, escaped)


def unescape(markdown: str) -> str:
    """The text a Markdown source shows once its backslash escapes are read, joiners left out (for tests)."""
    return _ESCAPED.sub(r"\1", markdown).replace(JOINER, "")
