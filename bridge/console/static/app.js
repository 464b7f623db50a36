// Tether console: polls GET /api/state once a second and redraws; actions POST /api/<name> (a JSON body
// and the header X-Tether-Console: 1, which the server asks of every state-changing call: a cross-site page
// cannot send it) after a confirmation. No libraries, nothing from the internet: tables from the DOM, charts
// on canvas.
"use strict";

const $ = (sel) => document.querySelector(sel);
const POLL_MS = 1000;
const COLORS = ["#1f5fbf", "#c62828", "#2e7d32", "#b26a00", "#6a1b9a", "#00838f", "#5d4037", "#37474f"];
let state = null;

for (const id of ["operator", "token"]) {
  const el = $("#" + id);
  el.value = sessionStorage.getItem("tether." + id) || "";
  el.addEventListener("change", () => sessionStorage.setItem("tether." + id, el.value));
}

function headers() {
  const h = { "Content-Type": "application/json", "X-Tether-Console": "1" };
  const token = $("#token").value.trim(), operator = $("#operator").value.trim();
  if (token) h["Authorization"] = "Bearer " + token;
  if (operator) h["X-Tether-Operator"] = operator;
  return h;
}

function toast(text, error) {
  const t = $("#toast");
  t.textContent = text;
  t.className = "show" + (error ? " error" : "");
  clearTimeout(toast.timer);
  toast.timer = setTimeout(() => { t.className = ""; }, error ? 8000 : 4000);
}

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v;
    else if (k.startsWith("data-")) e.setAttribute(k, v);
    else if (k === "onclick") e.addEventListener("click", v);
    else e[k] = v;
  }
  for (const c of children) if (c !== null && c !== undefined) e.append(c instanceof Node ? c : String(c));
  return e;
}

const pill = (text) => el("span", { class: "pill state-" + text }, text);
const fmt = (x, d = 2) => (x === null || x === undefined ? "–" : Number(x).toFixed(d));
const num = (x) => (typeof x !== "number" ? JSON.stringify(x) : Number.isInteger(x) ? String(x) : fmt(x, 3));
const clock = (t_ns) => new Date(t_ns / 1e6).toLocaleTimeString([], { hour12: false });

// ---- actions --------------------------------------------------------------------------------

function confirmAction(text) {
  return new Promise((resolve) => {
    const dialog = $("#confirm");
    $("#confirm-text").textContent = text;
    $("#confirm-why").value = "";
    dialog.onclose = () => resolve(dialog.returnValue === "ok" ? ($("#confirm-why").value || "") : null);
    dialog.showModal();
  });
}

async function act(name, body, text) {
  const why = await confirmAction(text);
  if (why === null) return;
  let reply;
  try {
    reply = await fetch("/api/" + name, { method: "POST", headers: headers(), body: JSON.stringify({ ...body, why }) });
  } catch (e) {
    toast(name + ": the gateway did not answer (" + e + ")", true);
    return;
  }
  const data = await reply.json().catch(() => ({}));
  if (!reply.ok) {
    toast(name + " refused (" + reply.status + "): " + (data.error || reply.statusText), true);
  } else {
    toast(name + " done by " + data.who);
  }
  poll();
}

$("#estop-all").addEventListener("click", () => act("estop", { target: { all: true } }, "E-stop ALL sessions?"));
$("#release-all").addEventListener("click", () => act("release", { target: { all: true } },
  "Release the all-sessions e-stop?"));

// ---- rendering ------------------------------------------------------------------------------

function renderFleet(s) {
  const g = s.gateway;
  $("#gateway").textContent = `gateway ${g.address} · Triton ${g.triton}` + (g.rollout ? ` · rollout ${g.rollout}` : "")
    + (g.logging && g.logging !== "ok" ? ` · logging ${g.logging}` : "");
  $("#gateway").classList.toggle("held", (g.logging || "").startsWith("degraded"));
  const rate = s.sessions.reduce((a, r) => a + r.steps_per_s, 0);
  $("#fleet-summary").textContent = `${s.sessions.length} sessions · ${fmt(rate, 0)} steps/s`;
  const estops = $("#estops");
  estops.replaceChildren(...s.estops.map((e) =>
    el("div", { class: "held" }, `E-STOP ${e.target} by ${e.who}${e.why ? ": " + e.why : ""}`)));
  const body = $("#sessions tbody");
  body.replaceChildren(...s.sessions.map((r) => {
    const held = r.estopped || r.edge_estopped;
    const robot = r.labels.robot || r.labels.node;
    const target = robot ? { robot } : { session_id: r.session_id };
    const who = robot ? `robot ${robot}` : `session ${r.session_id}`;
    const button = r.estopped
      ? el("button", { "data-action": "release", onclick: () => act("release", { target }, `Release ${who}?`) }, "release")
      : el("button", { class: "danger", "data-action": "estop", onclick: () => act("estop", { target }, `E-stop ${who}?`) },
        "e-stop");
    return el("tr", { "data-session": r.session_id },
      el("td", {}, r.session_id),
      el("td", {}, r.source),
      el("td", {}, ...Object.entries(r.labels).map(([k, v]) => el("span", { class: "label" }, `${k}=${v}`))),
      el("td", { class: "state" }, pill(held ? "held" : "running"), r.edge_estopped ? " edge" : ""),
      el("td", { class: "version", title: r.version_lag ? `${r.version_lag} versions behind for ${fmt(r.time_lag_s, 0)} s` : "" },
        `${r.policy} v${r.policy_version}`),
      el("td", { class: "num" }, fmt(r.steps_per_s, 1)),
      el("td", { class: "num" }, `${fmt(r.latency_p50_ms)} / ${fmt(r.latency_p99_ms)}`),
      el("td", {}, budget(r.hop_p50_ms)),
      el("td", { class: "num" }, r.episodes),
      el("td", { class: "num" }, fmt(r.mean_return, 1)),
      el("td", { class: "num" }, r.guard_interventions),
      el("td", { class: "err", title: r.last_error }, r.last_error),
      el("td", {}, button));
  }));
}

// A session's latency budget (robot clock): one bar, a segment per hop's recent median, the numbers on hover.
const HOPS = ["observation_age", "checks", "queue", "batch", "triton", "respond", "reply", "execution"];
function budget(hops) {
  const parts = HOPS.filter((k) => hops && hops[k] > 0);
  const total = parts.reduce((a, k) => a + hops[k], 0);
  const title = parts.map((k) => `${k} ${fmt(hops[k], 3)} ms`).join("\n");
  return el("div", { class: "budget", title, "data-hops": parts.join(" ") },
    ...parts.map((k) => el("span", { class: "hop hop-" + k, style: `width:${(100 * hops[k] / total).toFixed(1)}%` })),
    parts.length ? null : "–");
}

function renderVersions(s) {
  const box = $("#versions");
  box.replaceChildren(...s.versions.map((p) => {
    const ro = p.rollout;
    const summary = ro
      ? `live v${ro.live ?? "–"} · canary ${ro.canary ? "v" + ro.canary + " at " + fmt(ro.canary_fraction * 100, 0) + "%" : "–"}` +
        `${Object.keys(ro.canary_labels || {}).length ? " labels " + JSON.stringify(ro.canary_labels) : ""}` +
        ` · shadow ${ro.shadow ? "v" + ro.shadow : "–"}` +
        `${Object.keys(ro.pins || {}).length ? " · pins " + JSON.stringify(ro.pins) : ""}`
      : "no registry: the versions sessions act with";
    const fraction = el("input", { type: "number", min: 0, max: 100, step: 5, size: 4, value: ro ? Math.round(ro.canary_fraction * 100) : 10, "data-field": "canary-fraction" });
    const labels = el("input", { size: 14, placeholder: "robot=arm_1", "data-field": "canary-labels" });
    const actions = el("div", { class: "policy-actions" },
      el("button", { "data-action": "rollback", "data-policy": p.policy,
        onclick: () => act("rollback", { policy: p.policy }, `Roll back the live version of ${p.policy}?`) },
        "rollback live"),
      "canary %", fraction, "or labels", labels,
      el("button", { "data-action": "canary", "data-policy": p.policy, onclick: () => {
        const body = { policy: p.policy };
        if (labels.value.trim()) body.labels = Object.fromEntries(labels.value.split(",").map((kv) => kv.trim().split("=")));
        else body.fraction = Number(fraction.value) / 100;
        act("canary", body, `Set the canary of ${p.policy} to ${body.labels ? JSON.stringify(body.labels) : fraction.value + "%"}?`);
      } }, "set canary"));
    const rows = [...p.versions].reverse().map((v) => {
      const lin = v.lineage || {};
      const gate = (v.gate || []).map((c) => el("div", { class: c.passed ? "check-pass" : "check-fail" },
        `${c.passed ? "✓" : "✗"} ${c.name} `,
        el("span", { class: "figs" }, Object.entries(c.figures || {}).map(([k, x]) => `${k}=${num(x)}`).join(" "))));
      const st = v.stats || {};
      const figures = Object.keys(st).length
        ? Object.entries(st).map(([k, x]) => `${k}=${num(x)}`).join(" ")
        : "";
      const buttons = [];
      for (const to of ["shadow", "canary", "live"]) {
        if (v.state !== to && ["gated", "shadow", "canary", "retired"].includes(v.state)) {
          buttons.push(el("button", { "data-action": "promote", "data-policy": p.policy, "data-version": v.version, "data-to": to,
            onclick: () => act("promote", { policy: p.policy, version: v.version, to }, `Promote ${p.policy} v${v.version} to ${to}?`) },
            "→ " + to));
        }
      }
      if (["live", "canary", "shadow"].includes(v.state)) {
        buttons.push(el("button", { "data-action": "rollback-version", "data-policy": p.policy, "data-version": v.version,
          onclick: () => act("rollback", { policy: p.policy, version: v.version }, `Roll back ${p.policy} v${v.version} (${v.state})?`) },
          "rollback"));
      }
      return el("tr", { "data-policy": p.policy, "data-version": v.version },
        el("td", {}, "v" + v.version), el("td", { class: "vstate" }, pill(v.state)), el("td", { class: "num" }, v.sessions),
        el("td", {}, lin.algo ? `${lin.algo} ` : "", lin.parent_version ? `from v${lin.parent_version}` : "", lin.trainer_step ? ` · step ${lin.trainer_step}` : "",
          lin.trainer ? el("div", { class: "figs" }, lin.trainer) : null),
        el("td", {}, ...gate),
        el("td", { class: "num person", title: `${st.intervention_steps || 0} steps a person's command acted (intervention topic)` },
          st.intervention_steps ? `${(100 * st.intervention_rate).toFixed(1)}%` : "-"),
        el("td", { class: "figs" }, figures), el("td", {}, ...buttons));
    });
    return el("div", { class: "policy", "data-policy": p.policy },
      el("h3", {}, p.policy, " ", el("span", { class: "muted" }, summary)), actions,
      el("table", {}, el("thead", {}, el("tr", {}, ...["version", "state", "sessions", "lineage", "gate checks", "person", "runtime", ""].map((h) => el("th", {}, h)))),
        el("tbody", {}, ...rows)));
  }));
}

function renderAudit(s) {
  $("#audit tbody").replaceChildren(...s.audit.map((e) => {
    const change = e.kind === "state" ? `${e.from_state || "–"} → ${e.to_state}` :
      e.detail ? `${e.kind} ${e.detail}` : e.kind;
    return el("tr", { "data-kind": e.kind },
      el("td", {}, clock(e.t_ns)), el("td", {}, e.kind),
      el("td", {}, e.policy ? `${e.policy}${e.version ? " v" + e.version : ""}` : ""),
      el("td", {}, change), el("td", { class: "who" }, e.who), el("td", {}, e.why));
  }));
}

// ---- charts (canvas, our own small code) ----------------------------------------------------

function frame(canvas) {
  const ctx = canvas.getContext("2d");
  ctx.clearRect(0, 0, canvas.width, canvas.height);
  ctx.font = "11px system-ui, sans-serif";
  return { ctx, x0: 44, y0: canvas.height - 20, w: canvas.width - 54, h: canvas.height - 30 };
}

function axes(f, ymin, ymax) {
  const { ctx, x0, y0, w, h } = f;
  ctx.strokeStyle = "#d9dde3"; ctx.fillStyle = "#6b7280";
  for (let i = 0; i <= 4; i++) {
    const y = y0 - (h * i) / 4;
    ctx.beginPath(); ctx.moveTo(x0, y); ctx.lineTo(x0 + w, y); ctx.stroke();
    ctx.fillText(fmt(ymin + ((ymax - ymin) * i) / 4, Math.abs(ymax - ymin) < 10 ? 1 : 0), 2, y + 4);
  }
}

function lineChart(canvas, series) {
  const f = frame(canvas);
  const pts = series.flatMap((s) => s.points);
  if (!pts.length) { f.ctx.fillStyle = "#6b7280"; f.ctx.fillText("no data yet", f.x0 + 10, f.y0 - f.h / 2); return; }
  const t0 = Math.min(...pts.map((p) => p[0])), t1 = Math.max(...pts.map((p) => p[0]));
  let lo = Math.min(0, ...pts.map((p) => p[1])), hi = Math.max(...pts.map((p) => p[1]));
  if (hi <= lo) hi = lo + 1;
  axes(f, lo, hi);
  const X = (t) => f.x0 + (t1 > t0 ? ((t - t0) / (t1 - t0)) * f.w : f.w);
  const Y = (v) => f.y0 - ((v - lo) / (hi - lo)) * f.h;
  series.forEach((s, i) => {
    const c = COLORS[i % COLORS.length];
    f.ctx.strokeStyle = c; f.ctx.fillStyle = c; f.ctx.beginPath();
    s.points.forEach(([t, v], j) => (j ? f.ctx.lineTo(X(t), Y(v)) : f.ctx.moveTo(X(t), Y(v))));
    f.ctx.stroke();
    if (s.points.length < 60) s.points.forEach(([t, v]) => f.ctx.fillRect(X(t) - 1.5, Y(v) - 1.5, 3, 3));
    f.ctx.fillText(s.name, f.x0 + 8 + 90 * i, 12);
  });
  f.ctx.fillStyle = "#6b7280";
  f.ctx.fillText(`${fmt(t1 - t0, 0)} s`, f.x0 + f.w - 30, f.y0 + 14);
}

function barChart(canvas, edges, counts) {
  const f = frame(canvas);
  const max = Math.max(1, ...counts);
  axes(f, 0, max);
  const bw = f.w / counts.length;
  f.ctx.fillStyle = COLORS[0];
  counts.forEach((c, i) => {
    const bh = (c / max) * f.h;
    f.ctx.fillRect(f.x0 + i * bw + 1, f.y0 - bh, bw - 2, bh);
  });
  f.ctx.fillStyle = "#6b7280";
  edges.forEach((e, i) => { if (i % 2 === 0) f.ctx.fillText(String(e), f.x0 + i * bw, f.y0 + 14); });
}

function renderCharts(s) {
  const c = s.charts;
  lineChart($("#chart-returns"), Object.entries(c.returns).map(([name, points]) => ({ name, points })));
  barChart($("#chart-latency"), c.latency.edges_ms, c.latency.counts);
  const fresh = [{ name: "versions behind", points: c.lag_versions }];
  if (c.lag_s.length) fresh.push({ name: "seconds behind", points: c.lag_s });
  lineChart($("#chart-freshness"), fresh);
  lineChart($("#chart-steps"), [{ name: "steps/s", points: c.steps_per_s }]);
}

// ---- polling ---------------------------------------------------------------------------------

async function poll() {
  let reply;
  try {
    reply = await fetch("/api/state", { headers: headers(), cache: "no-store" });
  } catch (e) {
    $("#gateway").textContent = "gateway unreachable";
    return;
  }
  if (!reply.ok) {
    const data = await reply.json().catch(() => ({}));
    $("#gateway").textContent = `viewing refused (${reply.status}): ${data.error || ""}`;
    return;
  }
  state = await reply.json();
  renderFleet(state);
  const typing = document.activeElement && document.activeElement.tagName === "INPUT";
  if (!(typing && $("#versions").contains(document.activeElement))) renderVersions(state);  // not while one types
  renderAudit(state);
  renderCharts(state);
  document.body.dataset.updated = String(state.t);
}

poll();
setInterval(poll, POLL_MS);
