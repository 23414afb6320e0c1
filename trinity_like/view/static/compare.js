// Comparisons on the Curves tab (`trinity-like view COMPARE_DIR`): per entry of a `trinity-like compare`
// folder, the mean curve over its seeds with the 95 % Student-t band of that mean (both computed by the
// server, view/compare.py, with the comparison's own statistics), one colour per entry, one chart per
// metric, beside the verdict lines of compare.json. Uses app.js's helpers (h, $, api, COLORS, yRange,
// showWarnings, failed) and uPlot as app.js does; every text from the folder goes in as a text node.
"use strict";

function compareChartData(panel) {
  // x: every step any entry logged; per entry three series: its mean (drawn), the band's top and
  // bottom (not stroked; a band fills between them, absent where one seed logged the step).
  const steps = [...new Set(panel.entries.flatMap((e) => e.steps.filter(drawable)))].sort((a, b) => a - b);
  const at = new Map(steps.map((s, j) => [s, j]));
  const data = [steps], series = [{label: "step"}], bands = [];
  panel.entries.forEach((e, k) => {
    const mean = new Array(steps.length).fill(null), hi = mean.slice(), lo = mean.slice();
    e.steps.forEach((s, j) => {
      if (!at.has(s) || !drawable(e.mean[j])) return;
      mean[at.get(s)] = e.mean[j];
      if (drawable(e.low[j]) && drawable(e.high[j])) { lo[at.get(s)] = e.low[j]; hi[at.get(s)] = e.high[j]; }
    });
    const color = COLORS[k % COLORS.length], n = Math.max(0, ...e.n.filter(isNum));
    data.push(mean, hi, lo);
    series.push({label: `${e.label} (mean of ${e.runs} seed${e.runs === 1 ? "" : "s"})`, stroke: color, width: 2, spanGaps: true,
                 points: {show: true, size: 5}},
                {label: `${e.label} 95 % high`, stroke: "transparent", points: {show: false}},
                {label: `${e.label} 95 % low`, stroke: "transparent", points: {show: false}});
    if (n > 1) bands.push({series: [data.length - 2, data.length - 1], fill: color + "33"});
  });
  return {data, series, bands};
}

function withBand(u, i, opts) {  // an entry's line hidden or shown (a click on its legend): its band too
  if (i && (i - 1) % 3 === 0 && opts && "show" in opts) { u.setSeries(i + 1, {show: opts.show}); u.setSeries(i + 2, {show: opts.show}); }
}

function compareEl(c, ci) {
  const labels = c.entries.map((e) => e.label);
  const head = h("h3", {}, `comparison ${c.name}: ${labels.join(" vs ")}`,
    h("span", {class: "hint"}, ` (baseline ${c.baseline || "-"}; seeds ${c.seeds.join(", ") || "-"}; ` +
      `lines: mean over seeds, bands: its ${Math.round(100 * c.confidence)} % Student-t interval)`));
  const verdicts = h("ul", {class: "verdicts"}, ...c.entries.map((e, k) => h("li", {"data-entry": e.label},
    h("span", {class: "swatch", style: `background: ${COLORS[k % COLORS.length]}`}), h("b", {}, e.label), ": ",
    e.label === c.baseline ? "the baseline" : (e.lines.length ? e.lines.join("; ") : "no seed finished on both sides"))));
  const charts = h("div", {class: "compare-charts"});
  const box = h("div", {class: "compare", "data-compare": ci}, head, verdicts, charts);
  return {box, charts};
}

function drawCompares(list) {
  const root = $("#compares");
  root.replaceChildren();
  state.compares = [];
  list.forEach((c, ci) => {
    showWarnings(c.warnings);
    const {box, charts} = compareEl(c, ci);
    root.append(box);
    const drawn = {name: c.name, charts: {}};
    for (const panel of c.panels) {
      const el = h("div", {class: "panel cmp-panel", "data-key": panel.key}, h("h3", {}, `${panel.title} (${panel.key})`));
      charts.append(el);
      if (!panel.entries.some((e) => e.steps.length)) {
        el.append(h("p", {class: "hint"}, `no finished run of this comparison logged ${panel.key}`));
        continue;
      }
      const {data, series, bands} = compareChartData(panel);
      const width = Math.max(360, el.clientWidth - 10 || 460);
      const chart = new uPlot({width, height: 240, series, bands, scales: {x: {time: false}, y: {range: yRange}},
                               axes: [{label: "step"}, {}], legend: {live: false}, hooks: {setSeries: [withBand]}}, data, el);
      // the legend names each entry once: its band's edges follow its line (shown, hidden) and are not listed
      const rows = [...chart.root.querySelectorAll(".u-legend .u-series")], first = rows.length - series.length;  // x: no row
      rows.forEach((row, r) => { if (r > first && (r - first - 1) % 3) row.style.display = "none"; });
      drawn.charts[panel.key] = chart;
      el.dataset.entries = panel.entries.filter((e) => e.steps.length).length;
    }
    state.compares.push(drawn);
  });
}

async function loadCompares() {
  let list;
  try {
    list = REPORT ? (REPORT.compares || []) : await api("api/compares");
  } catch (err) {
    failed($("#compares"), err);
    return;
  }
  drawCompares(list);
}

loadCompares();
