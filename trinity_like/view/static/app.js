// The page of `trinity-like view` (served: data from /api) and `trinity-like report` (one file:
// data embedded as window.REPORT). Charts are uPlot's (vendor/). Every text from a run goes
// into the page as a text node, never as HTML; a number from a run is checked before use
// (a damaged file may hold null, text or 1e308 where a number belongs).
"use strict";

const REPORT = window.REPORT || null;
const COLORS = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#ca8a04", "#db2777", "#4b5563"];
const PANELS = [  // keys a panel draws when present; `prefix` takes every key that starts with it
  {title: "reward", keys: ["reward/mean", "explorer/reward/mean"]},
  {title: "held-out accuracy (+- 1 s.e.)", keys: ["eval/accuracy"], band: "eval/accuracy_stderr"},
  {title: "loss", keys: ["loss", "policy_loss", "kl_loss", "sft_loss", "rl_loss", "eval/loss", "eval/nll", "critic/value_loss"]},
  {title: "KL", keys: ["kl", "approx_kl", "ppo_kl", "kl_penalty"]},
  {title: "entropy", keys: ["entropy"]},
  {title: "clip fraction", keys: ["clip_frac", "clip_ratio_high", "clip_ratio_low", "critic/vf_clipfrac"]},
  {title: "response length (tokens)", keys: ["response_length/mean", "response_length/max", "eval/response_length"]},
  {title: "staleness (steps)", keys: ["staleness/mean", "staleness/max"]},
  {title: "seconds per step, by phase", prefix: "time/"},
  {title: "explorer process: seconds per step, by phase", prefix: "explorer/time/"},  // split mode
  {title: "tokens / s", keys: ["throughput/tokens_per_s"]},
  {title: "held-out pairs", keys: ["eval/reward_margin", "eval/reward_accuracy", "eval/margin"]},
];
const POLL_MS = 2000;
const DRAWABLE = 1e100;  // larger values are left out of the charts (an axis cannot span them)

const state = {runs: [], metrics: [], offsets: [], charts: {}, extra: [], version: null, page: 0};
const ZERO_SPAN = 1;  // a curve of zeros is drawn on [-1, 1] (yRange)
window.viewer = state;  // for the browser tests and for poking around in devtools

// -- small helpers ---------------------------------------------------------------------------
function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "style") el.style.cssText = v;
    else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (v !== null && v !== undefined && v !== false) el.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) if (c !== null && c !== undefined) el.append(c instanceof Node ? c : String(c));
  return el;
}
const $ = (sel) => document.querySelector(sel);
const isNum = (x) => typeof x === "number" && Number.isFinite(x);
const drawable = (x) => isNum(x) && Math.abs(x) <= DRAWABLE;
const fmt = (x, d = 3) => !isNum(x) ? (x === null || x === undefined ? "-" : String(x)) : (Number.isInteger(x) ? String(x) : x.toFixed(d));

function showWarnings(messages) {
  // damaged lines the server skipped (each once): named here as on its stderr
  const box = $("#warnings");
  state.warnings = state.warnings || new Set();
  for (const m of messages || []) state.warnings.add(m);
  box.hidden = !state.warnings.size;
  box.replaceChildren(...[...state.warnings].map((m) => h("li", {}, m)));
}

function failed(where, err) {  // a request that failed: said where its answer would have gone
  where.replaceChildren(h("p", {class: "message"}, `error: ${err.message}`));
}

async function api(path, params = {}) {
  if (REPORT) return fromReport(path, params);
  const url = new URL(path, location.href);
  for (const [k, v] of Object.entries(params)) if (v !== "" && v !== null && v !== undefined) url.searchParams.set(k, v);
  const r = await fetch(url);
  if (!r.ok) {
    let detail = await r.text();
    try { detail = JSON.parse(detail).detail || detail; } catch (_) { /* not JSON: the text as it came */ }
    throw new Error(`${path}: ${r.status} ${detail}`);
  }
  return r.json();
}

function fromReport(path, params) {  // the same answers, from the data embedded in a report
  const m = path.match(/^api\/runs(?:\/(\d+)\/(\w+))?$/);
  if (!m[1]) return REPORT.runs;
  const i = Number(m[1]), what = m[2];
  if (what === "metrics") return {rows: params.offset ? [] : REPORT.metrics[i], offset: 1, explorer_offset: 0};
  if (what === "versions") return REPORT.versions[i];
  if (what === "evals") return REPORT.evals[i];
  return REPORT.rollouts[i][params.version] || {error: `step ${params.version} is not in this report`};
}

// -- curves ------------------------------------------------------------------------------------
function panelKeys(panel, keys) {
  return panel.prefix ? keys.filter((k) => k.startsWith(panel.prefix)).sort() : panel.keys.filter((k) => keys.includes(k));
}

function allKeys() {
  const keys = new Set();
  for (const rows of state.metrics) for (const r of rows) for (const [k, v] of Object.entries(r)) if (drawable(v)) keys.add(k);
  keys.delete("step"); keys.delete("time");
  return [...keys];
}

function chartData(keys, band) {
  // x: the union of the steps of every run; one y series per (run, key), null where absent.
  const steps = [...new Set(state.metrics.flatMap((rows) => rows.map((r) => r.step).filter(drawable)))].sort((a, b) => a - b);
  const at = new Map(steps.map((s, j) => [s, j]));
  const data = [steps], series = [{label: "step"}], bands = [];
  state.metrics.forEach((rows, i) => {
    keys.forEach((key, k) => {
      const y = new Array(steps.length).fill(null), lo = band ? y.slice() : null, hi = band ? y.slice() : null;
      for (const r of rows) {
        if (!drawable(r[key]) || !drawable(r.step)) continue;
        const j = at.get(r.step);
        y[j] = r[key];
        if (band) { const e = drawable(r[band]) ? r[band] : 0; lo[j] = r[key] - e; hi[j] = r[key] + e; }
      }
      const color = COLORS[(state.runs.length > 1 ? i : k) % COLORS.length];
      const label = state.runs.length > 1 ? `${state.runs[i].name}: ${key}` : key;
      data.push(y);
      series.push({label, stroke: color, width: 2, spanGaps: true, dash: state.runs.length > 1 && k ? [6, 4] : undefined,
                   points: {show: true, size: 5}});
      if (band) {
        data.push(hi, lo);
        series.push({label: `${label} + s.e.`, stroke: "transparent", spanGaps: true, points: {show: false}},
                    {label: `${label} - s.e.`, stroke: "transparent", spanGaps: true, points: {show: false}});
        bands.push({series: [data.length - 2, data.length - 1], fill: color + "33"});
      }
    });
  });
  return {data, series, bands};
}

function yRange(u, min, max) {
  // uPlot's own range (rangeNum with 10 % padding), except for a curve of zeros, which it
  // draws on an axis from 0 to 100 as if the values were large: that one gets [-1, 1].
  if (min === null || max === null) return [0, 1];
  if (min === 0 && max === 0) return [-ZERO_SPAN, ZERO_SPAN];
  return uPlot.rangeNum(min, max, 0.1, true);
}

function countPoints(data, series) {
  let n = 0;
  data.forEach((ys, s) => { if (s > 0 && !series[s].label.endsWith("s.e.")) n += ys.filter((y) => y !== null).length; });
  return n;
}

function drawPanels() {
  const keys = allKeys();
  const panels = PANELS.map((p) => ({title: p.title, keys: panelKeys(p, keys), band: p.band}))
    .concat(state.extra.map((k) => ({title: k, keys: [k]})))
    .filter((p) => p.keys.length);
  const box = $("#panels");
  if (!panels.length) {
    box.replaceChildren(h("p", {class: "message"}, state.runs.map((r) => r.path).join(", ") +
      ": no metrics yet (metrics.jsonl is empty or absent); this page updates as the run writes them."));
    state.charts = {};
    return;
  }
  const more = $("#more"), used = new Set(panels.flatMap((p) => p.keys));
  more.replaceChildren(h("option", {value: ""}, "add a metric..."), ...keys.filter((k) => !used.has(k)).sort().map((k) => h("option", {value: k}, k)));
  for (const p of panels) {
    const {data, series, bands} = chartData(p.keys, p.band);
    let chart = state.charts[p.title];
    if (chart && chart.series.length === series.length) {
      chart.setData(data);
    } else {
      if (chart) chart.destroy();
      let el = box.querySelector(`.panel[data-title="${CSS.escape(p.title)}"]`);
      if (!el) { el = h("div", {class: "panel", "data-title": p.title}, h("h3", {}, p.title)); box.append(el); }
      const width = Math.max(360, el.clientWidth - 10 || 460);
      chart = new uPlot({width, height: 220, series, bands, cursor: {sync: {key: "steps"}},
                         scales: {x: {time: false}, y: {range: yRange}}, axes: [{label: "step"}, {}], legend: {live: false}}, data, el);
      state.charts[p.title] = chart;
    }
    chart.root.parentElement.dataset.points = countPoints(data, series);
  }
}

async function pollMetrics() {
  let changed = false;
  for (const run of state.runs) {
    try {
      const at = state.offsets[run.id];
      const got = await api(`api/runs/${run.id}/metrics`, {offset: at.offset, explorer_offset: at.explorer_offset});
      if (got.rows.length) { state.metrics[run.id].push(...got.rows); changed = true; }
      showWarnings(got.warnings);
      state.offsets[run.id] = {offset: got.offset, explorer_offset: got.explorer_offset};
    } catch (err) {
      $("#live").textContent = `cannot reach the server: ${err.message}`;
      return;
    }
  }
  if (changed) drawPanels();
  if (!REPORT) {
    $("#live").textContent = `live: metrics read ${new Date().toLocaleTimeString()}`;
    setTimeout(pollMetrics, POLL_MS);
  }
}

// -- rollouts ----------------------------------------------------------------------------------
const RATIO_FULL = 0.5;  // |log(sampler / trainer)| at which a token's colour is at its strongest

function tokenColour(mode, sample, t) {
  if (mode === "logprob" && sample.logprobs) {
    const p = Math.exp(sample.logprobs[t]);  // certain tokens stay white, unlikely ones turn red
    return `rgba(220, 38, 38, ${(0.85 * (1 - p)).toFixed(3)})`;
  }
  if (mode === "advantage" && sample.advantages) {
    const a = sample.advantages[t], alpha = Math.min(1, Math.abs(a) / 2) * 0.7;
    return a >= 0 ? `rgba(22, 163, 74, ${alpha.toFixed(3)})` : `rgba(220, 38, 38, ${alpha.toFixed(3)})`;
  }
  if (mode === "ratio" && sample.logprobs && sample.trainer_logprobs) {
    // log ratio 0 (the two agree) stays white; the sampler surer than the trainer turns
    // blue, less sure orange: where off-policy drift or a layout bug shows itself
    const d = sample.logprobs[t] - sample.trainer_logprobs[t], alpha = Math.min(1, Math.abs(d) / RATIO_FULL) * 0.8;
    return d >= 0 ? `rgba(37, 99, 235, ${alpha.toFixed(3)})` : `rgba(234, 88, 12, ${alpha.toFixed(3)})`;
  }
  return "";
}

function responseEl(sample, mode) {
  // Runs of equal mask are turns: the policy's tokens (mask 1) and, in multi-turn episodes,
  // what the environment added in between (mask 0, greyed: not trained on).
  const out = h("div", {class: "response"});
  const masked = sample.mask ? sample.mask.some((m) => !m) : false;
  let turn = 0, prev = null;
  sample.tokens.forEach((piece, t) => {
    const m = sample.mask ? sample.mask[t] : 1;
    if (masked && m !== prev) out.append(h("span", {class: "turn"}, m ? `turn ${++turn} (policy)` : "environment (masked, not trained)"));
    prev = m;
    const lp = sample.logprobs ? sample.logprobs[t] : null, tlp = sample.trainer_logprobs ? sample.trainer_logprobs[t] : null;
    const title = `token ${sample.token_ids[t]}` + (lp === null ? "" : `, sampler logprob ${fmt(lp, 4)}`) +
      (tlp === null ? "" : `, trainer logprob ${fmt(tlp, 4)}`) +
      (!isNum(lp) || !isNum(tlp) ? "" : `, ratio ${fmt(Math.exp(lp - tlp), 4)}`) +
      (sample.advantages ? `, advantage ${fmt(sample.advantages[t], 4)}` : "");
    out.append(h("span", {class: m ? "tok" : "tok masked", style: m ? `background: ${tokenColour(mode, sample, t)}` : "",
                          "data-lp": lp, "data-tlp": tlp, "data-adv": sample.advantages ? sample.advantages[t] : null, title}, piece));
  });
  return out;
}

function sampleEl(s, mode) {
  const rewardClass = s.reward === 1 ? "reward-1" : s.reward === 0 ? "reward-0" : "";
  const info = Object.entries(s.info).filter(([k]) => k !== "answer").map(([k, v]) => `${k}: ${JSON.stringify(v)}`);
  return h("div", {class: "sample", "data-reward": s.reward, "data-eid": s.eid},
    h("div", {class: "meta"},
      h("span", {class: rewardClass}, "reward ", h("b", {}, fmt(s.reward))),
      h("span", {}, "advantage ", h("b", {}, s.advantage === null ? "not recorded" : fmt(s.advantage))),
      h("span", {}, "finish ", h("b", {}, s.finish_reason || "-")),
      h("span", {}, "length ", h("b", {}, s.length)),
      h("span", {}, "model version ", h("b", {}, s.model_version)),
      h("span", {}, s.status + (s.trained_at === null ? "" : `, trained at step ${s.trained_at}`) +
        (s.consumed_by === null ? "" : ` (in checkpoint ${s.consumed_by})`)),
      s.is_expert ? h("b", {}, "expert row") : null,
      info.length ? h("span", {class: "hint"}, info.join("; ")) : null),
    responseEl(s, mode));
}

function filterParams() {
  return REPORT ? {} : Object.fromEntries(new FormData($("#filters")).entries());
}

async function loadVersions() {
  const run = Number($("#ro-run").value || 0);
  const summary = state.runs[run];
  // answers still on their way for the run shown before (its steps, a step's rollouts) are stale now
  const ticket = state.versionsTicket = (state.versionsTicket || 0) + 1;
  state.ticket = (state.ticket || 0) + 1;
  $("#groups").replaceChildren(); $("#notes").replaceChildren(); $("#pager").replaceChildren(); $("#summary").replaceChildren();
  if (summary.buffer_missing) {
    $("#steps").replaceChildren(h("p", {class: "message"}, summary.buffer_missing));
    return;
  }
  let versions;
  try {
    versions = await api(`api/runs/${run}/versions`);
  } catch (err) {
    if (ticket === state.versionsTicket) failed($("#steps"), err);  // a buffer that cannot be read: said here
    return;
  }
  if (ticket !== state.versionsTicket) return;  // another run was chosen meanwhile: its steps win
  if (!versions.length) {
    $("#steps").replaceChildren(h("p", {class: "message"}, `${summary.path}: the buffer has no rows yet`));
    return;
  }
  $("#steps").replaceChildren(...versions.map((v) => h("button", {class: "step", "data-version": v.version, title: `${v.rows} rows`,
    onclick: () => { state.page = 0; showStep(v.version); }}, `${v.version}`)));
  if (state.version === null || !versions.some((v) => v.version === state.version)) state.version = versions[0].version;
  showStep(state.version);
}

async function showStep(version) {
  state.version = version;
  const run = Number($("#ro-run").value || 0), ticket = state.ticket = (state.ticket || 0) + 1;
  document.querySelectorAll(".step").forEach((b) => b.classList.toggle("active", Number(b.dataset.version) === version));
  let got;
  try {
    got = await api(`api/runs/${run}/rollouts`, {version, page: state.page, ...filterParams()});
  } catch (err) {
    if (ticket === state.ticket) { $("#summary").replaceChildren(); failed($("#groups"), err); }
    return;
  }
  if (ticket !== state.ticket) return;  // a later click asked for another step meanwhile
  state.rollouts = got;
  if (got.error) { $("#groups").replaceChildren(h("p", {class: "message"}, got.error)); return; }
  const finish = $("#filters select[name=finish_reason]"), chosen = finish.value;
  finish.replaceChildren(h("option", {value: ""}, "any"), ...got.finish_reasons.map((f) => h("option", {value: f}, f)));
  finish.value = chosen;
  document.querySelector("input[value=ratio]").disabled = !(got.stored.trainer_logprobs && got.stored.logprobs);
  document.querySelector("input[value=advantage]").disabled = !got.stored.advantages;
  document.querySelector("input[value=logprob]").disabled = !got.stored.logprobs;
  const pairPage = got.kind === "pairs";  // a DPO / RM run's training pairs: no per-token colours, only the text filter
  $("#colour").style.display = pairPage ? "none" : "";
  for (const el of document.querySelectorAll("#filters .sample-filter")) el.style.display = pairPage ? "none" : "";
  $("#notes").replaceChildren(...got.notes.map((n) => h("li", {}, n)));
  renderGroups();
  $("#summary").textContent = `step ${version}: ${got.matching} of ${got.rows} ${pairPage ? "training pairs" : "samples"} match` +
    (REPORT ? ` (this report keeps the first ${got.page_size})` : "") + (!pairPage && got.pairs.length ? `; ${got.pairs.length} pairs` : "");
  const pager = $("#pager");
  pager.replaceChildren();
  if (got.pages > 1) {
    pager.append(h("button", {disabled: got.page === 0, onclick: () => { state.page--; showStep(version); }}, "previous"),
                 `page ${got.page + 1} of ${got.pages}`,
                 h("button", {disabled: got.page + 1 >= got.pages, onclick: () => { state.page++; showStep(version); }}, "next"));
  }
}

function renderGroups() {
  const got = state.rollouts, mode = document.querySelector("input[name=colour]:checked").value;
  const groups = got.groups.map((g) => {
    const rewards = g.samples.map((s) => s.reward).filter((r) => r !== null);
    const mean = rewards.length ? rewards.reduce((a, b) => a + b, 0) / rewards.length : null;
    return h("div", {class: "group", "data-group": g.group_id},
      h("div", {class: "meta"}, h("span", {}, "task ", h("b", {}, g.task_id || "-")),
        h("span", {}, `${g.samples.length} samples shown, mean reward `, h("b", {}, fmt(mean))),
        g.samples[0].info.answer !== undefined ? h("span", {}, "reference answer ", h("b", {}, g.samples[0].info.answer)) : null),
      h("div", {class: "prompt"}, g.prompt), ...g.samples.map((s) => sampleEl(s, mode)));
  });
  const pairs = got.pairs.map((p) => h("div", {class: "group", "data-pair": p.task_id}, h("div", {class: "prompt"}, p.prompt),
    h("div", {class: "pair"}, h("div", {class: "chosen"}, p.chosen), h("div", {class: "rejected"}, p.rejected)),
    p.metrics ? pairScores(p.metrics) : h("p", {class: "hint"}, "this pair's scores were not recorded (a pair in a buffer)")));
  $("#groups").replaceChildren(...groups, ...pairs);
  if (!groups.length && !pairs.length) $("#groups").append(h("p", {class: "message"}, "no sample of this step matches the filters"));
}

function pairScores(metrics) {
  // chosen and rejected side by side for each score (DPO's implicit reward, an RM's score),
  // then whatever else the loss reported for the pair alone (margin, accuracy)
  const sides = Object.keys(metrics).filter((k) => k.endsWith("_chosen")).map((k) => k.slice(0, -"_chosen".length))
    .filter((base) => `${base}_rejected` in metrics);
  const paired = new Set(sides.flatMap((b) => [`${b}_chosen`, `${b}_rejected`]));
  const rest = Object.entries(metrics).filter(([k]) => !paired.has(k));
  return h("table", {class: "evals scores"},
    h("tr", {}, h("th", {}, "score"), h("th", {}, "chosen"), h("th", {}, "rejected")),
    ...sides.map((b) => h("tr", {"data-score": b}, h("td", {}, b), h("td", {class: "good"}, fmt(metrics[`${b}_chosen`], 4)),
                          h("td", {class: "bad"}, fmt(metrics[`${b}_rejected`], 4)))),
    ...rest.map(([k, v]) => h("tr", {"data-score": k}, h("td", {}, k), h("td", {colspan: 2}, fmt(v, 4)))));
}

// -- held-out evaluations -----------------------------------------------------------------------
async function loadEvals() {
  const run = Number($("#ev-run").value || 0), ticket = state.evalsTicket = (state.evalsTicket || 0) + 1;
  let items;
  try {
    items = await api(`api/runs/${run}/evals`);
  } catch (err) {
    if (ticket === state.evalsTicket) failed($("#eval-body"), err);
    return;
  }
  if (ticket !== state.evalsTicket) return;  // another run was chosen meanwhile
  state.evals = items;
  renderEvals();
}

// the whole prompt the model got (an earlier evals.jsonl has only the last message's text)
function promptEls(it) {
  const earlier = (it.messages || []).slice(0, -1);
  return [...earlier.map((m) => h("div", {class: "msg-" + m.role}, h("span", {class: "role"}, m.role + ": "), m.content)), h("div", {}, it.prompt)];
}

// the reference as written, and what the reward compared when it says (exact_match: "#### 12" -> 12)
function referenceEls(it) {
  if (it.reference === undefined || it.reference === it.answer) return [it.answer];
  return [h("div", {class: "compared"}, "compared: ", h("b", {}, it.reference)), h("div", {class: "hint"}, it.answer)];
}

function renderEvals() {
  const items = state.evals || [], body = $("#eval-body");
  if (!items.length) {
    body.replaceChildren(h("p", {class: "message"}, "no held-out answers recorded (evals.jsonl): the run had no " +
      "buffer.eval_tasks / eval_data, has not evaluated yet, or predates this file"));
    return;
  }
  const q = $("#ev-text").value.toLowerCase();
  const match = (it) => !q || JSON.stringify(it).toLowerCase().includes(q);
  const steps = [...new Set(items.map((it) => it.step))].sort((a, b) => a - b);
  const answers = items.filter((it) => it.kind === "answer" && match(it)), pairs = items.filter((it) => it.kind === "pair" && match(it));
  const parts = [];
  if (answers.length) {
    const byTask = new Map();
    for (const it of answers) {
      if (!byTask.has(it.task_id)) byTask.set(it.task_id, {first: it, at: {}});
      byTask.get(it.task_id).at[it.step] = it;
    }
    parts.push(h("p", {class: "hint"}, `${byTask.size} held-out problems; what the weights of each step answered (green: reward 1)`),
      h("table", {class: "evals"},
        h("tr", {}, h("th", {}, "problem"), h("th", {}, "reference"), ...steps.map((s) => h("th", {}, `step ${s}`))),
        ...[...byTask.values()].map(({first, at}) => h("tr", {"data-task": first.task_id},
          h("td", {class: "problem"}, ...promptEls(first)), h("td", {class: "reference"}, ...referenceEls(first)),
          ...steps.map((s) => at[s] ? h("td", {class: "ans " + (at[s].reward > 0 ? "good" : "bad"),
            title: `reward ${at[s].reward}, ${at[s].finish_reason}` + (at[s].parsed !== undefined ? `, final answer read: ${at[s].parsed}` : "")},
            at[s].response) : h("td", {}, ""))))));
  }
  if (pairs.length) {
    parts.push(h("p", {class: "hint"}, "held-out pairs: chosen (green) vs rejected (red), with what the loss reports for each pair at each step"));
    const byPair = new Map();
    for (const it of pairs) { if (!byPair.has(it.task_id)) byPair.set(it.task_id, []); byPair.get(it.task_id).push(it); }
    for (const [id, evs] of byPair) {
      const first = evs[0];
      parts.push(h("div", {class: "group", "data-pair": id}, h("div", {class: "prompt"}, first.prompt),
        h("div", {class: "pair"}, h("div", {class: "chosen"}, first.chosen), h("div", {class: "rejected"}, first.rejected)),
        h("table", {class: "evals"}, h("tr", {}, h("th", {}, "step"), ...Object.keys(first.metrics).map((k) => h("th", {}, k))),
          ...evs.map((e) => h("tr", {}, h("td", {}, e.step), ...Object.values(e.metrics).map((v) => h("td", {}, fmt(v))))))));
    }
  }
  if (!parts.length) parts.push(h("p", {class: "message"}, "nothing matches the filter"));
  body.replaceChildren(...parts);
}

// -- start -----------------------------------------------------------------------------------------
function openTab(name) {
  if (!state.runs.length && name !== "curves") return;  // a comparison none of whose runs could be opened
  if (name === "rollouts" && !state.rolloutsLoaded) { state.rolloutsLoaded = true; loadVersions(); }
  if (name === "evals" && !state.evals) loadEvals();
  if (name === "curves") drawPanels();
}

async function main() {
  // the tabs answer from the first moment: a click before the list of runs has arrived acts once it has
  const runs = api("api/runs");
  document.querySelectorAll(".tab").forEach((tab) => tab.addEventListener("click", () => {
    document.querySelectorAll(".tab, .view").forEach((el) => el.classList.remove("active"));
    tab.classList.add("active");
    $(`#${tab.dataset.tab}`).classList.add("active");
    runs.then(() => openTab(tab.dataset.tab));
  }));
  state.runs = await runs;
  showWarnings(state.runs.flatMap((r) => r.warnings || []));
  state.metrics = state.runs.map(() => []);
  state.offsets = state.runs.map(() => ({offset: 0, explorer_offset: 0}));
  $("#runs").replaceChildren(...state.runs.map((r, i) => h("span", {title: r.path},
    h("span", {class: "swatch", style: `background: ${COLORS[i % COLORS.length]}`}), r.name + (r.algorithm ? ` (${r.algorithm})` : ""))));
  for (const sel of document.querySelectorAll(".run-select")) {
    sel.replaceChildren(...state.runs.map((r) => h("option", {value: r.id}, r.name)));
    sel.parentElement.style.display = state.runs.length > 1 ? "" : "none";
  }
  $("#more").addEventListener("change", (e) => { if (e.target.value) { state.extra.push(e.target.value); drawPanels(); } });
  $("#filters").addEventListener("submit", (e) => { e.preventDefault(); state.page = 0; showStep(state.version); });
  if (REPORT) $("#filters").style.display = "none";
  document.querySelectorAll("input[name=colour]").forEach((r) => r.addEventListener("change", renderGroups));
  $("#ro-run").addEventListener("change", () => { state.version = null; loadVersions(); });
  $("#ev-run").addEventListener("change", loadEvals);
  $("#ev-text").addEventListener("input", renderEvals);
  await pollMetrics();
  drawPanels();
}

main().catch((err) => document.body.prepend(h("p", {class: "message"}, `error: ${err.message}`)));
