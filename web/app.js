// vitc serve's page: asks /v1/info what the loaded model can do, then runs
// the picked image through each endpoint that applies. No framework, no
// build step, nothing from another origin (the server's CSP forbids it).
"use strict";

const $ = (id) => document.getElementById(id);
let info = null;      // GET /v1/info
let image = null;     // the picked image as a data: URL
let attention = null; // the last /v1/attention item, redrawn when the opacity moves
let apiKey = sessionStorage.getItem("vitc-api-key") || "";

// viridis at 9 stops, as `vitc attention-map` draws it
const VIRIDIS = [[0x44, 0x01, 0x54], [0x47, 0x2d, 0x7b], [0x3b, 0x52, 0x8b], [0x2c, 0x72, 0x8e],
  [0x21, 0x90, 0x8c], [0x27, 0xad, 0x81], [0x5d, 0xc8, 0x63], [0xaa, 0xdc, 0x32],
  [0xfd, 0xe7, 0x25]];

function status(text, isError) {
  const s = $("status");
  s.textContent = text;
  s.classList.toggle("error", !!isError);
}

async function api(method, path, body) {
  const headers = {};
  if (apiKey) headers["Authorization"] = "Bearer " + apiKey;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const r = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  let data = null;
  try { data = await r.json(); } catch (e) { data = null; }
  if (r.status === 401) $("key-panel").hidden = false;
  if (!r.ok) {
    const msg = data && data.error ? data.error.message : r.status + " " + r.statusText;
    const err = new Error(path + ": " + msg);
    err.status = r.status;
    throw err;
  }
  return data;
}

function setPanel(id, state) { $(id).dataset.state = state; }

async function loadInfo() {
  try {
    info = await api("GET", "/v1/info");
  } catch (e) {
    // 503: the model is still loading; ask again shortly
    if (e.status === 503) {
      $("model-line").textContent = "the model is loading…";
      setTimeout(loadInfo, 1000);
      return;
    }
    $("model-line").textContent = e.message;
    $("model-line").classList.add("error");
    return;
  }
  const c = info.capabilities;
  $("model-line").textContent = info.model + " · " + info.family + " · " + info.image_size[1] + "×" +
    info.image_size[0] + " px, patch " + info.patch_size + " · embedding " + info.embedding_dim +
    (c.classify ? " · " + info.num_classes + " classes" : "") + (c.zero_shot ? " · text tower" : "");
  $("classes-panel").hidden = !c.classify;
  $("attention-panel").hidden = !c.attention;
  $("zeroshot-panel").hidden = !c.zero_shot;
  $("segment-panel").hidden = !c.segment;
  $("depth-panel").hidden = !c.depth;
  document.body.dataset.ready = "1";
}

function bars(list, items) {
  list.textContent = "";
  for (const it of items) {
    const li = document.createElement("li");
    li.dataset.label = it.label;
    li.dataset.prob = String(it.prob);
    const label = document.createElement("span");
    label.className = "label";
    label.textContent = it.label;
    label.title = it.label;
    const track = document.createElement("span");
    track.className = "track";
    const fill = document.createElement("span");
    fill.className = "fill";
    fill.style.width = Math.max(0, Math.min(100, it.prob * 100)).toFixed(2) + "%";
    track.appendChild(fill);
    const pct = document.createElement("span");
    pct.className = "pct";
    pct.textContent = (it.prob * 100).toFixed(2) + "%";
    li.append(label, track, pct);
    list.appendChild(li);
  }
}

async function classify() {
  setPanel("classes-panel", "busy");
  try {
    const r = await api("POST", "/v1/classify", { input: image, top_k: 5 });
    bars($("classes"), r.data[0].topk.map((t) => ({ label: t.label !== null ? t.label : "class " + t.index, prob: t.prob })));
    setPanel("classes-panel", "done");
  } catch (e) {
    setPanel("classes-panel", "error");
    throw e;
  }
}

async function zeroShot() {
  const labels = $("zs-labels").value.split(",").map((s) => s.trim()).filter((s) => s.length);
  if (!image || !labels.length) return;
  setPanel("zeroshot-panel", "busy");
  const body = { input: image, labels, top_k: labels.length };
  if ($("zs-templates").value) body.templates = $("zs-templates").value;
  try {
    const r = await api("POST", "/v1/zero-shot", body);
    bars($("zs-results"), r.data[0].labels);
    setPanel("zeroshot-panel", "done");
  } catch (e) {
    setPanel("zeroshot-panel", "error");
    throw e;
  }
}

// Output pixel i of a map cell every `cell` pixels: the two cells it reads
// and the second's weight (bilinear, align_corners=False, edges clamped).
function tap(i, cell, n) {
  let s = (i + 0.5) / cell - 0.5;
  if (s < 0) s = 0;
  if (s > n - 1) s = n - 1;
  const i0 = Math.floor(s);
  return [i0, Math.min(i0 + 1, n - 1), s - i0];
}

function viridis(t) {
  t = Math.max(0, Math.min(1, t || 0));
  const x = t * 8, i = Math.min(7, Math.floor(x)), f = x - i;
  return [0, 1, 2].map((c) => (1 - f) * VIRIDIS[i][c] + f * VIRIDIS[i + 1][c]);
}

function drawAttention() {
  const a = attention;
  if (!a) return;
  const w = a.image.width, h = a.image.height, [gh, gw] = a.grid;
  const z = Math.max(1, Math.floor(448 / Math.max(w, h)));
  const cv = $("attn-canvas");
  cv.width = w * z;
  cv.height = h * z;
  const rgb = Uint8Array.from(atob(a.image.rgb), (ch) => ch.charCodeAt(0));
  const flat = a.map.flat();
  const lo = Math.min(...flat), hi = Math.max(...flat);
  const alpha = parseFloat($("attn-alpha").value);
  const cellY = (h / gh) * z, cellX = (w / gw) * z;
  const ctx = cv.getContext("2d");
  const out = ctx.createImageData(cv.width, cv.height);
  for (let y = 0; y < cv.height; y++) {
    const [y0, y1, fy] = tap(y, cellY, gh);
    for (let x = 0; x < cv.width; x++) {
      const [x0, x1, fx] = tap(x, cellX, gw);
      const v = (1 - fy) * ((1 - fx) * a.map[y0][x0] + fx * a.map[y0][x1]) +
        fy * ((1 - fx) * a.map[y1][x0] + fx * a.map[y1][x1]);
      const col = viridis(hi > lo ? (v - lo) / (hi - lo) : 0);
      const p = (Math.floor(y / z) * w + Math.floor(x / z)) * 3, o = (y * cv.width + x) * 4;
      for (let c = 0; c < 3; c++) out.data[o + c] = Math.round((1 - alpha) * rgb[p + c] + alpha * col[c]);
      out.data[o + 3] = 255;
    }
  }
  ctx.putImageData(out, 0, 0);
  cv.dataset.drawn = String(Number(cv.dataset.drawn || 0) + 1);
}

async function attend() {
  setPanel("attention-panel", "busy");
  try {
    const r = await api("POST", "/v1/attention", { input: image, method: $("attn-method").value });
    attention = r.data[0];
    drawAttention();
    setPanel("attention-panel", "done");
  } catch (e) {
    setPanel("attention-panel", "error");
    throw e;
  }
}

// Segment Anything and Depth Anything: shown only when /v1/info says the
// model has a mask decoder or a depth head.
function drawPicked(cv) {
  const img = new Image();
  img.onload = () => {
    cv.width = img.naturalWidth;
    cv.height = img.naturalHeight;
    cv.getContext("2d").drawImage(img, 0, 0);
  };
  img.src = image;
}

function drawMask(cv, m, color) {
  const ctx = cv.getContext("2d");
  const bytes = Uint8Array.from(atob(m.data), (ch) => ch.charCodeAt(0));
  const lay = ctx.getImageData(0, 0, cv.width, cv.height);
  for (let y = 0; y < cv.height; y++)
    for (let x = 0; x < cv.width; x++) {
      const v = bytes[Math.floor(y * m.height / cv.height) * m.width + Math.floor(x * m.width / cv.width)];
      const o = (y * cv.width + x) * 4;
      const col = color ? (v ? color : null) : viridis(v / 255);
      if (!col) continue;
      for (let c = 0; c < 3; c++) lay.data[o + c] = color ? 0.5 * lay.data[o + c] + 0.5 * col[c] : col[c];
    }
  ctx.putImageData(lay, 0, 0);
}

async function segmentAt(ev) {
  const cv = $("seg-canvas"), box = cv.getBoundingClientRect();
  const x = (ev.clientX - box.left) * cv.width / box.width, y = (ev.clientY - box.top) * cv.height / box.height;
  try {
    const r = await api("POST", "/v1/segment", { input: image, points: [[x, y]], labels: [1] });
    drawPicked(cv);
    setTimeout(() => drawMask(cv, r.data[0].mask, [255, 80, 60]), 50);
  } catch (e) {
    status(e.message, true);
  }
}

async function depth() {
  const r = await api("POST", "/v1/depth", { input: image });
  const cv = $("depth-canvas");
  cv.width = r.data[0].depth.width;
  cv.height = r.data[0].depth.height;
  drawMask(cv, r.data[0].depth, null);
}

async function run() {
  if (!info || !image) return;
  const c = info.capabilities, jobs = [];
  status("running…");
  if (c.classify) jobs.push(classify());
  if (c.attention) jobs.push(attend());
  if (c.zero_shot) jobs.push(zeroShot());
  if (c.segment) drawPicked($("seg-canvas"));
  if (c.depth) jobs.push(depth());
  const res = await Promise.allSettled(jobs);
  const bad = res.filter((r) => r.status === "rejected");
  if (bad.length) status(bad.map((r) => r.reason.message).join("; "), true);
  else status("done");
}

function pick(file) {
  if (!file) return;
  if (!/^image\/(png|jpeg)$/.test(file.type)) {
    status("pick a PNG or JPEG image (this is " + (file.type || "an unknown type") + ")", true);
    return;
  }
  const rd = new FileReader();
  rd.onload = () => {
    image = rd.result;
    $("preview").src = image;
    $("preview").hidden = false;
    run();
  };
  rd.onerror = () => status("cannot read the file", true);
  status("reading " + file.name + "…");
  rd.readAsDataURL(file);
}

document.addEventListener("DOMContentLoaded", () => {
  $("file").addEventListener("change", (e) => pick(e.target.files[0]));
  const drop = $("drop");
  drop.addEventListener("dragover", (e) => { e.preventDefault(); drop.classList.add("over"); });
  drop.addEventListener("dragleave", () => drop.classList.remove("over"));
  drop.addEventListener("drop", (e) => {
    e.preventDefault();
    drop.classList.remove("over");
    pick(e.dataTransfer.files[0]);
  });
  $("attn-alpha").addEventListener("input", drawAttention);
  $("attn-method").addEventListener("change", () => { if (image) attend().catch((e) => status(e.message, true)); });
  $("zs-form").addEventListener("submit", (e) => {
    e.preventDefault();
    zeroShot().then(() => status("done"), (err) => status(err.message, true));
  });
  $("seg-canvas").addEventListener("click", segmentAt);
  $("key-save").addEventListener("click", () => {
    apiKey = $("api-key").value.trim();
    sessionStorage.setItem("vitc-api-key", apiKey);
    $("key-panel").hidden = true;
    loadInfo().then(run);
  });
  loadInfo().then(run);
});
