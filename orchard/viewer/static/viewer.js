// Orchard trajectory viewer: vanilla JS, no build step, nothing loaded from outside this server.
// Routes (location.hash): "#/" the episode list, "#/episode/<id>" one episode, "#/curves" the run's curves.
// Every value from the run reaches the DOM as textContent or an attribute, never as HTML.
"use strict";

const FILTERS = ["run", "task", "status", "stage", "policy_version", "kind", "reward_min", "reward_max"];
const LIST_REFRESH_MS = 5000;
const SVG_NS = "http://www.w3.org/2000/svg";
const PALETTE = ["#2f6fb3", "#e07b00", "#1c7c35", "#8e44ad", "#b3261e", "#00838f", "#6d4c41"];

let runInfo = null;
let listTimer = null;
let currentEpisode = null;

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === null || value === undefined) continue;
    if (key === "class") node.className = value;
    else if (key === "onclick") node.addEventListener("click", value);
    else node.setAttribute(key, value);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function svg(tag, attrs = {}, text = null) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, value);
  if (text !== null) node.textContent = text;
  return node;
}

async function api(path) {
  const response = await fetch(path);
  const body = await response.json().catch(() => ({}));
  if (!response.ok) throw new Error(body.detail ? JSON.stringify(body.detail) : `HTTP ${response.status}`);
  return body;
}

function showStatus(message) {
  document.getElementById("status").textContent = message || "";
}

function fmtTime(ms) {
  return ms === null || ms === undefined ? "" : new Date(ms).toISOString().replace("T", " ").slice(0, 19);
}

function fmtNum(value, digits = 3) {
  return value === null || value === undefined ? "–" : Number(value).toFixed(digits);
}

// ---- run header, sidebar and filter choices ----

async function loadRun() {
  runInfo = await api("/api/run");
  document.getElementById("run-title").textContent =
    `${runInfo.run_id} · ${runInfo.run_dir} · ${runInfo.bus} bus · ${runInfo.episodes} episodes`;
  const form = document.getElementById("filters");
  const choices = { ...runInfo.choices, run: Object.keys(runInfo.runs) };
  for (const name of ["run", "task", "status", "stage", "policy_version"]) fillSelect(form.elements[name], choices[name]);
  renderSidebar();
}

function fillSelect(select, values) {
  const kept = select.value;
  select.replaceChildren(el("option", { value: "" }, "any"), ...values.map((v) => el("option", { value: String(v) }, String(v))));
  select.value = values.map(String).includes(kept) ? kept : "";
}

function renderSidebar() {
  const form = document.getElementById("filters");
  const runs = Object.entries(runInfo.runs).map(([run, count]) =>
    el("li", { class: form.elements.run.value === run ? "active" : "", onclick: () => setFilter("run", run) },
      run, el("span", { class: "meta" }, `${count} episodes`)));
  document.getElementById("runs").replaceChildren(...runs);
  const stages = runInfo.stages.map((stage) =>
    el("li", { class: form.elements.stage.value === stage.name ? "active" : "", "data-stage": stage.name,
      onclick: () => setFilter("stage", stage.name) },
      stage.name,
      el("span", { class: "meta" }, `${stage.status} · ${stage.episodes} episodes`),
      el("span", { class: "meta" }, `${fmtTime(stage.started_ms)} → ${fmtTime(stage.ended_ms) || "…"}`)));
  document.getElementById("stages").replaceChildren(...stages);
}

function setFilter(name, value) {
  const field = document.getElementById("filters").elements[name];
  field.value = field.value === value ? "" : value;
  location.hash = "#/";
  loadEpisodes();
}

// ---- the episode list ----

function filterQuery() {
  const form = document.getElementById("filters");
  const params = new URLSearchParams();
  for (const name of FILTERS) {
    const value = form.elements[name].value;
    if (value !== "" && !(name === "kind" && value === "all")) params.set(name, value);
  }
  return params.toString();
}

async function loadEpisodes() {
  try {
    const data = await api(`/api/episodes?${filterQuery()}`);
    showStatus("");
    document.getElementById("count").textContent =
      `${data.total} episode(s)` + (data.total > data.episodes.length ? `, newest ${data.episodes.length} shown` : "");
    document.querySelector("#episodes tbody").replaceChildren(...data.episodes.map(episodeRow));
    if (runInfo) renderSidebar();
  } catch (error) {
    showStatus(error.message);
  }
}

function episodeRow(row) {
  const open = () => { location.hash = `#/episode/${encodeURIComponent(row.episode_id)}`; };
  return el("tr", { "data-episode-id": row.episode_id, onclick: open },
    el("td", { class: "mono" }, row.episode_id),
    el("td", {}, row.task_id),
    el("td", { class: row.status }, row.status + (row.eval ? " (held-out)" : "")),
    el("td", {}, fmtNum(row.reward)),
    el("td", {}, row.stage || "–"),
    el("td", {}, row.policy_version ?? "–"),
    el("td", {}, row.model_calls),
    el("td", {}, row.samples),
    el("td", {}, fmtTime(row.ended_ms)));
}

// ---- one episode ----

async function showEpisode(id) {
  const view = document.getElementById("episode-view");
  view.replaceChildren(el("p", {}, "loading…"));
  try {
    currentEpisode = await api(`/api/episodes/${encodeURIComponent(id)}`);
    showStatus("");
  } catch (error) {
    view.replaceChildren(el("p", { class: "FAILED", id: "episode-error" }, error.message), backLink());
    return;
  }
  renderEpisode(view, currentEpisode);
}

function backLink() {
  return el("p", {}, el("a", { href: "#/" }, "← all episodes"));
}

function renderEpisode(view, ep) {
  const outcome = ep.outcome;
  const summary = el("dl", { class: "kv" },
    ...kv("task", ep.task_id), ...kv("run", ep.run_id), ...kv("group", ep.group_id || "–"),
    ...kv("status", ep.status), ...kv("reward", fmtNum(ep.reward)),
    ...kv("success", outcome ? String(outcome.success) : "–"), ...kv("policy version", ep.policy_version ?? "–"),
    ...kv("stage", ep.stage || "–"), ...kv("model calls", ep.model_calls),
    ...kv("trajectory", ep.complete === null ? "not assembled" : ep.complete ? "complete" : "incomplete"),
    ...kv("started", fmtTime(outcome && outcome.started_ms)), ...kv("ended", fmtTime(ep.ended_ms)));
  const parts = [backLink(), el("h2", { id: "episode-title", class: "mono" }, ep.episode_id), summary];
  if (ep.error) parts.push(el("p", { class: "FAILED" }, ep.error));
  if (outcome) parts.push(outcomeBlock(ep, outcome));
  parts.push(colourBar(ep));
  parts.push(...ep.calls.map(callBlock));
  if (ep.unplaced_scores.length) parts.push(el("h3", {}, "Scores of calls not shown"), scoresTable(ep.unplaced_scores));
  view.replaceChildren(...parts);
  recolour();
}

function kv(key, value) {
  return [el("dt", {}, key), el("dd", {}, value === null || value === undefined ? "–" : String(value))];
}

function outcomeBlock(ep, outcome) {
  const signals = Object.entries(outcome.signals);
  const block = el("div", { id: "outcome" }, el("h3", {}, "Outcome"));
  if (signals.length) {
    block.append(el("table", { id: "signals" },
      el("thead", {}, el("tr", {}, el("th", {}, "signal"), el("th", {}, "value"))),
      el("tbody", {}, ...signals.map(([name, value]) => el("tr", {}, el("td", {}, name), el("td", {}, fmtNum(value)))))));
  }
  if (outcome.error) block.append(el("pre", { class: "FAILED" }, outcome.error));
  outcome.artifact_uris.forEach((uri, n) => block.append(el("div", {},
    el("a", { href: `/api/episodes/${encodeURIComponent(ep.episode_id)}/artifacts/${n}`, target: "_blank" }, uri))));
  return block;
}

function colourBar(ep) {
  const select = el("select", { id: "colour" }, el("option", { value: "logprob" }, "logprob of the sampled token"));
  for (const sample of ep.samples) {
    const label = `${sample.kind} sample ${sample.sample_id} (reward ${fmtNum(sample.reward)})`;
    select.append(el("option", { value: `mask:${sample.sample_id}` }, `loss mask · ${label}`));
    select.append(el("option", { value: `adv:${sample.sample_id}` }, `advantage · ${label}`));
  }
  select.addEventListener("change", recolour);
  return el("div", { id: "colour-bar" }, el("label", {}, "Colour tokens by ", select), " ",
    el("span", { id: "legend", class: "legend" }), " ",
    el("span", { class: "legend" }, `${ep.samples.length} training sample(s) · tokens as ${ep.token_mode}`));
}

function callBlock(call) {
  const head = `Call ${call.call_index} · conversation ${call.conversation_id} · policy ${call.policy_version} · ` +
    `${call.finish_reason} · ${call.prompt_tokens} prompt + ${call.token_ids.length} completion tokens` +
    (call.latency_ms === null ? "" : ` · ${call.latency_ms.toFixed(0)} ms`);
  const block = el("div", { class: "call", "data-call-index": call.call_index }, el("h3", {}, head));
  const messages = call.request_messages.map(messageBlock);
  const older = messages.slice(0, Math.max(0, messages.length - 2));
  if (older.length) block.append(el("details", {}, el("summary", {}, `${older.length} earlier message(s)`), ...older));
  block.append(...messages.slice(older.length));
  const reply = el("div", { class: "msg role-assistant completion" }, el("div", { class: "role" }, "completion"));
  if (call.response_text) reply.append(el("pre", { class: "response-text" }, call.response_text));
  reply.append(...call.response_tool_calls.map(toolCallBlock));
  reply.append(tokenBlock(call));
  block.append(reply);
  if (call.scores.length) block.append(el("h4", {}, "Dense scores"), scoresTable(call.scores));
  return block;
}

function messageBlock(message) {
  const role = message.role || message.type || "item";
  const block = el("div", { class: `msg role-${role}` },
    el("div", { class: "role" }, role === "tool" ? `tool output${message.tool_call_id ? " · " + message.tool_call_id : ""}` : role));
  const content = message.content;
  if (typeof content === "string") block.append(el("pre", {}, content));
  else if (Array.isArray(content)) {
    for (const part of content) block.append(el("pre", {}, part.text !== undefined ? part.text : JSON.stringify(part)));
  } else if (content === undefined) block.append(el("pre", {}, JSON.stringify(message, null, 1)));
  for (const call of message.tool_calls || []) block.append(toolCallBlock(call));
  return block;
}

function toolCallBlock(call) {
  const fn = call.function || call;
  let args = fn.arguments;
  try { args = JSON.stringify(JSON.parse(args), null, 1); } catch (_) { /* keep the raw text */ }
  if (typeof args !== "string") args = JSON.stringify(args, null, 1);
  return el("div", { class: "toolcall" }, el("span", { class: "mono" }, `tool call ${fn.name || "?"}`), el("pre", {}, args));
}

function tokenBlock(call) {
  const ids = call.token_text === null;
  const box = el("div", { class: `tokens${ids ? " ids" : ""}`, "data-call-index": call.call_index });
  call.token_ids.forEach((id, i) => {
    const text = call.token_text === null ? String(id) : call.token_text[i];
    box.append(el("span", { class: "tok", "data-id": id, "data-i": i }, text));
  });
  return box;
}

function scoresTable(scores) {
  return el("table", { class: "scores" },
    el("thead", {}, el("tr", {}, ...["call", "scorer", "tokens", "score", "details"].map((h) => el("th", {}, h)))),
    el("tbody", {}, ...scores.map((s) => el("tr", {},
      el("td", {}, s.call_index), el("td", {}, s.scorer),
      el("td", {}, s.token_start === null ? "whole call" : `${s.token_start}–${s.token_end}`),
      el("td", {}, fmtNum(s.score)), el("td", { class: "mono" }, JSON.stringify(s.details))))));
}

// ---- token colours ----

function recolour() {
  if (!currentEpisode) return;
  const mode = document.getElementById("colour").value;
  const [kind, sampleId] = mode === "logprob" ? ["logprob", null] : [mode.slice(0, mode.indexOf(":")), mode.slice(mode.indexOf(":") + 1)];
  const maxAdv = kind === "adv" ? maxAdvantage(sampleId) : 1;
  for (const call of currentEpisode.calls) {
    const box = document.querySelector(`.tokens[data-call-index="${call.call_index}"]`);
    const span = sampleId === null ? null : call.sample_spans[sampleId];
    box.querySelectorAll(".tok").forEach((tok, i) => paintToken(tok, i, call, kind, span, maxAdv));
  }
  document.getElementById("legend").replaceChildren(...legend(kind, maxAdv));
}

function paintToken(tok, i, call, kind, span, maxAdv) {
  const lp = call.logprobs ? call.logprobs[i] : null;
  const parts = [`id ${call.token_ids[i]}`, `logprob ${fmtNum(lp)}`];
  tok.classList.remove("masked");
  let colour = "";
  if (kind === "logprob") colour = lp === null ? "" : probColour(Math.exp(lp));
  else if (span) {
    const mask = span.loss_mask[i];
    const adv = span.advantages[i];
    parts.push(`loss mask ${mask}`, `advantage ${fmtNum(adv)}`);
    if (kind === "mask") colour = mask ? "#cfe3ff" : "";
    else colour = mask ? advColour(adv, maxAdv) : "";
    if (!mask) tok.classList.add("masked");
    tok.dataset.mask = mask;
    tok.dataset.advantage = adv;
  } else parts.push("not in this sample");
  tok.style.background = colour;
  tok.title = parts.join(" · ");
}

function probColour(p) {
  return `hsl(${Math.round(120 * Math.max(0, Math.min(1, p)))}, 75%, 82%)`;
}

function advColour(adv, maxAdv) {
  if (adv === null) return "";
  const strength = Math.min(1, Math.abs(adv) / (maxAdv || 1));
  return adv >= 0 ? `rgba(28, 124, 53, ${0.12 + 0.6 * strength})` : `rgba(179, 38, 30, ${0.12 + 0.6 * strength})`;
}

function maxAdvantage(sampleId) {
  let max = 0;
  for (const call of currentEpisode.calls) {
    const span = call.sample_spans[sampleId];
    if (span) for (const a of span.advantages) if (a !== null) max = Math.max(max, Math.abs(a));
  }
  return max;
}

function legend(kind, maxAdv) {
  const swatch = (colour) => el("span", { class: "swatch", style: `background:${colour}` });
  if (kind === "logprob") return ["p = 0", swatch(probColour(0)), swatch(probColour(0.5)), swatch(probColour(1)), "p = 1"];
  if (kind === "mask") return [swatch("#cfe3ff"), "trained (mask 1)", swatch("#fbfbfc"), "masked"];
  return [`−${fmtNum(maxAdv, 2)}`, swatch(advColour(-maxAdv, maxAdv)), swatch(advColour(0, maxAdv)),
    swatch(advColour(maxAdv, maxAdv)), `+${fmtNum(maxAdv, 2)}`];
}

// ---- curves ----

async function showCurves() {
  const size = document.getElementById("window").value || 16;
  let data;
  try {
    data = await api(`/api/curves?window=${encodeURIComponent(size)}`);
    showStatus("");
  } catch (error) {
    showStatus(error.message);
    return;
  }
  const series = [];
  Object.entries(data.training).forEach(([stage, points], n) => {
    const name = stage || "outside stages";
    series.push({ name: `${name}: mean reward`, colour: PALETTE[n % PALETTE.length], points: points.map((p) => [p.time, p.mean_reward]) });
    series.push({ name: `${name}: success rate`, colour: PALETTE[n % PALETTE.length], dash: "5 3",
      points: points.map((p) => [p.time, p.success_rate]) });
  });
  const held = data.heldout.filter((row) => row.time !== null);
  if (held.length) {
    series.push({ name: "held-out success", colour: "#000", marker: "circle", points: held.map((r) => [r.time, r.success_rate]),
      bars: held.map((r) => [r.time, r.success_ci_low, r.success_ci_high]) });
    series.push({ name: "held-out mean reward", colour: "#777", marker: "square", points: held.map((r) => [r.time, r.mean_reward]) });
  }
  const bands = data.stages.filter((s) => s.started_ms !== null).map((s) => ({ x0: s.started_ms, x1: s.ended_ms, label: s.name }));
  drawChart(document.getElementById("reward-chart"), series, bands, [0, 1]);
  const loss = Object.entries(data.loss).map(([trainer, points], n) =>
    ({ name: trainer, colour: PALETTE[n % PALETTE.length], points: points.map((p) => [p.time, p.loss]) }));
  drawChart(document.getElementById("loss-chart"), loss, bands, null);
  renderHeldout(data.heldout);
}

function drawChart(container, series, bands, yFloor) {
  const W = 960, H = 300, L = 50, R = 10, T = 10, B = 60;
  const xs = series.flatMap((s) => s.points.map((p) => p[0])).concat(bands.flatMap((b) => [b.x0, b.x1 ?? b.x0]));
  const ys = series.flatMap((s) => s.points.map((p) => p[1]).concat((s.bars || []).flatMap((b) => [b[1], b[2]])))
    .filter((y) => y !== null).concat(yFloor || []);
  const chart = svg("svg", { width: W, height: H, class: "chart" });
  container.replaceChildren(chart);
  if (!series.some((s) => s.points.length)) {
    chart.append(svg("text", { x: L, y: H / 2 }, "nothing recorded yet"));
    return;
  }
  let [x0, x1, y0, y1] = [Math.min(...xs), Math.max(...xs), Math.min(...ys), Math.max(...ys)];
  if (x1 === x0) x1 = x0 + 1;
  if (y1 === y0) y1 = y0 + 1;
  const X = (x) => L + ((x - x0) / (x1 - x0)) * (W - L - R);
  const Y = (y) => T + (1 - (y - y0) / (y1 - y0)) * (H - T - B);
  bands.forEach((band, n) => {
    const right = X(band.x1 ?? x1);
    chart.append(svg("rect", { x: X(band.x0), y: T, width: Math.max(1, right - X(band.x0)), height: H - T - B,
      fill: n % 2 ? "#f1f4f8" : "#e6edf5" }));
    chart.append(svg("text", { x: X(band.x0) + 3, y: T + 12 }, band.label));
  });
  for (let i = 0; i <= 4; i++) {
    const y = y0 + ((y1 - y0) * i) / 4;
    chart.append(svg("line", { x1: L, x2: W - R, y1: Y(y), y2: Y(y), stroke: "#ddd" }));
    chart.append(svg("text", { x: 4, y: Y(y) + 4 }, y.toFixed(2)));
  }
  for (let i = 0; i <= 4; i++) {
    const x = x0 + ((x1 - x0) * i) / 4;
    chart.append(svg("text", { x: Math.min(X(x), W - R - 115), y: H - B + 14 }, fmtTime(x)));
  }
  series.forEach((s, n) => drawSeries(chart, s, X, Y, L + (n % 4) * 230, H - B + 30 + Math.floor(n / 4) * 14));
}

function drawSeries(chart, s, X, Y, legendX, legendY) {
  const points = s.points.filter((p) => p[1] !== null);
  if (s.marker) {
    for (const [x, y] of points) {
      chart.append(s.marker === "circle" ? svg("circle", { cx: X(x), cy: Y(y), r: 4, fill: s.colour })
        : svg("rect", { x: X(x) - 3.5, y: Y(y) - 3.5, width: 7, height: 7, fill: s.colour }));
    }
    for (const [x, low, high] of s.bars || []) chart.append(svg("line", { x1: X(x), x2: X(x), y1: Y(low), y2: Y(high), stroke: s.colour }));
  } else {
    chart.append(svg("polyline", { points: points.map(([x, y]) => `${X(x)},${Y(y)}`).join(" "), fill: "none",
      stroke: s.colour, "stroke-width": 1.6, "stroke-dasharray": s.dash || "" }));
  }
  chart.append(svg("line", { x1: legendX, x2: legendX + 18, y1: legendY - 4, y2: legendY - 4, stroke: s.colour,
    "stroke-width": 3, "stroke-dasharray": s.dash || "" }));
  chart.append(svg("text", { x: legendX + 22, y: legendY }, s.name));
}

function renderHeldout(rows) {
  const table = document.getElementById("heldout");
  const heads = ["stage", "selection", "tasks", "success rate", "95% CI", "mean reward", "vs previous", "evaluated"];
  table.tHead.replaceChildren(el("tr", {}, ...heads.map((h) => el("th", {}, h))));
  table.tBodies[0].replaceChildren(...rows.map((r) => el("tr", {},
    el("td", {}, r.stage), el("td", {}, r.selection), el("td", {}, r.tasks),
    el("td", {}, `${(100 * r.success_rate).toFixed(1)}% (${r.successes}/${r.tasks})`),
    el("td", {}, `${(100 * r.success_ci_low).toFixed(1)}–${(100 * r.success_ci_high).toFixed(1)}%`),
    el("td", {}, fmtNum(r.mean_reward)),
    el("td", {}, r.wins === null ? "–" : `+${r.wins}/−${r.losses} (p ${fmtNum(r.p_value)})`),
    el("td", {}, r.evaluated_at))));
}

// ---- routing ----

function route() {
  const hash = location.hash || "#/";
  const views = { list: "list-view", episode: "episode-view", curves: "curves-view" };
  const current = hash.startsWith("#/episode/") ? "episode" : hash === "#/curves" ? "curves" : "list";
  for (const [name, id] of Object.entries(views)) document.getElementById(id).hidden = name !== current;
  clearInterval(listTimer);
  if (current === "episode") showEpisode(decodeURIComponent(hash.slice("#/episode/".length)));
  else if (current === "curves") showCurves();
  else {
    loadEpisodes();
    listTimer = setInterval(() => { loadRun().catch(() => {}); loadEpisodes(); }, LIST_REFRESH_MS);
  }
}

document.getElementById("filters").addEventListener("change", () => loadEpisodes());
document.getElementById("reset").addEventListener("click", () => setTimeout(loadEpisodes, 0));
document.getElementById("window").addEventListener("change", showCurves);
window.addEventListener("hashchange", route);
loadRun().then(route, (error) => { showStatus(error.message); route(); });
