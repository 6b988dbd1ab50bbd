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
  if (c.segment || c.depth)
    $("model-line").textContent = info.model + " · " + (c.segment ? "Segment Anything" : "Depth Anything" +
      (info.metric ? " (metric)" : ""));
  else
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
// model has a mask decoder or a depth head (a SAM or Depth Anything model
// is then the one loaded).

// inferno at 9 stops, as `vitc depth` draws it
const INFERNO = [[0x00, 0x00, 0x04], [0x1b, 0x0c, 0x42], [0x4b, 0x0c, 0x6b], [0x78, 0x1c, 0x6d],
  [0xa5, 0x2c, 0x60], [0xcf, 0x44, 0x46], [0xed, 0x69, 0x25], [0xfb, 0x9a, 0x06],
  [0xfc, 0xff, 0xa4]];

function inferno(t) {
  t = Math.max(0, Math.min(1, t || 0));
  const x = t * 8, i = Math.min(7, Math.floor(x)), f = x - i;
  return [0, 1, 2].map((c) => Math.round((1 - f) * INFERNO[i][c] + f * INFERNO[i + 1][c]));
}

// base64 of little-endian float32s
function floats(b64) {
  const bytes = Uint8Array.from(atob(b64), (ch) => ch.charCodeAt(0));
  const dv = new DataView(bytes.buffer), out = new Float32Array(bytes.length / 4);
  for (let i = 0; i < out.length; i++) out[i] = dv.getFloat32(4 * i, true);
  return out;
}

let picked = null;  // the picked image, decoded, drawn under the mask
let seg = { points: [], labels: [], imageId: null, mask: null, width: 0, height: 0 };

function drawSegment() {
  const cv = $("seg-canvas");
  if (!picked) return;
  cv.width = picked.naturalWidth;
  cv.height = picked.naturalHeight;
  const ctx = cv.getContext("2d");
  ctx.drawImage(picked, 0, 0);
  if (seg.mask && seg.width === cv.width && seg.height === cv.height) {
    const lay = ctx.getImageData(0, 0, cv.width, cv.height), col = [30, 144, 255];
    for (let i = 0; i < seg.mask.length; i++) {
      if (!(seg.mask[i] > 0)) continue;
      for (let c = 0; c < 3; c++) lay.data[4 * i + c] = 0.45 * lay.data[4 * i + c] + 0.55 * col[c];
    }
    ctx.putImageData(lay, 0, 0);
  }
  const r = Math.max(3, Math.round(Math.max(cv.width, cv.height) / 120));
  seg.points.forEach(([x, y], i) => {
    ctx.beginPath();
    ctx.arc(x, y, r, 0, 2 * Math.PI);
    ctx.fillStyle = seg.labels[i] ? "#2fbf4a" : "#e5383b";
    ctx.fill();
    ctx.lineWidth = 1;
    ctx.strokeStyle = "#fff";
    ctx.stroke();
  });
  cv.dataset.points = JSON.stringify(seg.points);
  cv.dataset.drawn = String(Number(cv.dataset.drawn || 0) + 1);
}

function clearSegment() {
  seg.points = [];
  seg.labels = [];
  seg.mask = null;
  $("seg-iou").textContent = "";
  drawSegment();
}

async function segmentAt(ev) {
  ev.preventDefault();
  if (!image || !picked) return;
  const cv = $("seg-canvas"), box = cv.getBoundingClientRect();
  const x = (ev.clientX - box.left) * cv.width / box.width, y = (ev.clientY - box.top) * cv.height / box.height;
  // shift-click or right-click: a background point
  seg.points.push([x, y]);
  seg.labels.push(ev.shiftKey || ev.button === 2 ? 0 : 1);
  drawSegment();
  const body = { points: seg.points, labels: seg.labels, format: "logits",
    multimask: seg.points.length === 1 };  // one point is ambiguous: keep the best of three
  if (seg.imageId) body.image_id = seg.imageId;
  else body.input = image;
  setPanel("segment-panel", "busy");
  try {
    let r;
    try {
      r = await api("POST", "/v1/segment", body);
    } catch (e) {
      // the server's cache may have dropped the image: send it again
      if (!seg.imageId || e.status !== 400 || !e.message.includes("image_id")) throw e;
      delete body.image_id;
      body.input = image;
      r = await api("POST", "/v1/segment", body);
    }
    seg.imageId = r.image_id;
    const all = floats(r.logits), [n, h, w] = r.shape;
    let best = 0;
    for (let k = 1; k < n; k++) if (r.iou[k] > r.iou[best]) best = k;
    seg.mask = all.subarray(best * h * w, (best + 1) * h * w);
    seg.width = w;
    seg.height = h;
    $("seg-iou").textContent = "predicted IoU " + r.iou[best].toFixed(3) +
      (r.cached ? " (embedding cached)" : "");
    $("seg-iou").dataset.iou = String(r.iou[best]);
    drawSegment();
    setPanel("segment-panel", "done");
  } catch (e) {
    setPanel("segment-panel", "error");
    status(e.message, true);
  }
}

async function depth() {
  setPanel("depth-panel", "busy");
  try {
    const r = await api("POST", "/v1/depth", { input: image, format: "float32" });
    const d = floats(r.depth), cv = $("depth-canvas");
    cv.width = r.width;
    cv.height = r.height;
    const ctx = cv.getContext("2d"), out = ctx.createImageData(r.width, r.height);
    const span = r.max > r.min ? r.max - r.min : 1;
    for (let i = 0; i < d.length; i++) {
      const t = (d[i] - r.min) / span;
      // metric depth: near is small, drawn bright as relative (inverse) depth is
      const col = inferno(r.metric ? 1 - t : t);
      for (let c = 0; c < 3; c++) out.data[4 * i + c] = col[c];
      out.data[4 * i + 3] = 255;
    }
    ctx.putImageData(out, 0, 0);
    $("depth-range").textContent = (r.metric ? "metres " : "relative depth ") +
      r.min.toPrecision(4) + " … " + r.max.toPrecision(4);
    cv.dataset.drawn = String(Number(cv.dataset.drawn || 0) + 1);
    setPanel("depth-panel", "done");
  } catch (e) {
    setPanel("depth-panel", "error");
    throw e;
  }
}

function loadPicked() {
  return new Promise((resolve) => {
    const img = new Image();
    img.onload = () => { picked = img; resolve(); };
    img.onerror = () => resolve();
    img.src = image;
  });
}

async function run() {
  if (!info || !image) return;
  const c = info.capabilities, jobs = [];
  status("running…");
  if (c.classify) jobs.push(classify());
  if (c.attention) jobs.push(attend());
  if (c.zero_shot) jobs.push(zeroShot());
  if (c.segment) {
    seg = { points: [], labels: [], imageId: null, mask: null, width: 0, height: 0 };
    $("seg-iou").textContent = "";
    await loadPicked();
    drawSegment();
  }
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
  $("seg-canvas").addEventListener("contextmenu", segmentAt);
  $("seg-clear").addEventListener("click", clearSegment);
  $("key-save").addEventListener("click", () => {
    apiKey = $("api-key").value.trim();
    sessionStorage.setItem("vitc-api-key", apiKey);
    $("key-panel").hidden = true;
    loadInfo().then(run);
  });
  loadInfo().then(run);
});
