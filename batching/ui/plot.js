// One Plotly chart that stays mounted across reruns: the first call draws it, later calls redraw it in place
// with Plotly.react (st.plotly_chart re-mounts a chart whose figure changed, so every knob move paid a full
// Plotly.newPlot per chart). plotly.js comes from the app's static folder, loaded once per page.
const PLOTLY_SRC = "app/static/plotly.min.js";
const PRELOAD = "preload";  // plot.py's preload(): no chart, only load plotly.js

function loadPlotly() {
  if (window.Plotly) return Promise.resolve(window.Plotly);
  if (!window.__batchingPlotly) {
    window.__batchingPlotly = new Promise((resolve, reject) => {
      const s = document.createElement("script");
      s.src = new URL(PLOTLY_SRC, document.baseURI).href;
      s.onload = () => resolve(window.Plotly);
      s.onerror = () => { window.__batchingPlotly = null; reject(new Error("could not load " + s.src)); };
      document.head.appendChild(s);
    });
  }
  return window.__batchingPlotly;
}

function text(data) {
  if (typeof data === "string") return data;
  if (data instanceof ArrayBuffer || ArrayBuffer.isView(data)) return new TextDecoder().decode(data);
  return JSON.stringify(data);
}

function fullscreenButton(div) {
  return {
    name: "Fullscreen", title: "Fullscreen",
    icon: {width: 512, height: 512, path: "M32 32h160v64H96v96H32zm288 0h160v160h-64V96h-96zM32 320h64v96h96v64H32zm416 0h64v160H320v-64h96z"},
    click: () => (document.fullscreenElement ? document.exitFullscreen() : div.requestFullscreen()),
  };
}

export default function (component) {
  const { data, parentElement } = component;
  if (data === PRELOAD) {  // page.setup: fetch and compile plotly.js while the server runs the page
    loadPlotly().catch(() => {});
    return;
  }
  let div = parentElement.querySelector(":scope > .batching-plot");
  if (!div) {
    div = document.createElement("div");
    div.className = "batching-plot";
    div.style.width = "100%";
    parentElement.appendChild(div);
  }
  const spec = text(data);
  if (spec === div.__batchingSpec) return;  // the same figure: nothing to redraw
  div.__batchingSpec = spec;
  const sent = JSON.parse(spec);
  const fig = sent.figure || {};
  const config = Object.assign({responsive: true, displaylogo: false, showSendToCloud: false}, sent.config || {});
  config.modeBarButtonsToAdd = [fullscreenButton(div), ...(config.modeBarButtonsToAdd || [])];
  const layout = Object.assign({}, fig.layout || {});
  if (layout.height === undefined) layout.height = 450;
  loadPlotly().then((Plotly) => {
    if (div.__batchingSpec !== spec) return;  // a newer figure arrived while plotly.js loaded
    const t0 = performance.now();
    Plotly.react(div, fig.data || [], layout, config);
    // the draw's synchronous part as a User Timing entry: DevTools traces and performance.getEntriesByName show it
    performance.measure("batching-plot", {start: t0, detail: {key: component.key, bytes: spec.length}});
    if (!div.__batchingResize && window.ResizeObserver) {
      // a chart drawn in a closed expander, a hidden tab or before the sidebar moved gets its width back
      let last = div.clientWidth;
      div.__batchingResize = new ResizeObserver(() => {
        if (div.clientWidth !== last && div.clientWidth > 0 && div._fullLayout) {
          last = div.clientWidth;
          Plotly.Plots.resize(div);
        }
      });
      div.__batchingResize.observe(div);
    }
  }).catch((err) => {
    div.textContent = "The chart could not be drawn: " + err.message;
  });
  // Streamlit calls what this returns when the chart leaves the page, and also when a call was overtaken by a
  // newer figure before it ran: free the chart only once its node is really gone
  return () => setTimeout(() => {
    if (div.isConnected) return;
    if (div.__batchingResize) div.__batchingResize.disconnect();
    if (window.Plotly) window.Plotly.purge(div);
  }, 0);
}
