"""The baseline of benchmarks/bench_browser.py: the least a Streamlit page with a live chart costs.

One slider and one 200-point Plotly line that the slider changes; nothing cached, nothing simulated.
``streamlit run benchmarks/trivial_app.py`` shows it by hand.
"""
import numpy as np
import plotly.graph_objects as go
import streamlit as st

st.set_page_config(page_title="Trivial baseline", layout="wide")
st.title("Trivial baseline")
freq = st.slider("Frequency", 1, 100, 10)
x = np.linspace(0.0, 1.0, 200)
fig = go.Figure(go.Scatter(x=x, y=np.sin(2 * np.pi * freq * x), mode="lines", name="sin"))
fig.update_layout(height=420, title=f"sin(2π · {freq} · x)")
st.plotly_chart(fig, width="stretch")
