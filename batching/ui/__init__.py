"""Streamlit pieces the pages share (the only Streamlit code in the package)."""
