// nbscale's live training-progress figure, drawn in the browser: the panels of the PNG figure
// (nbscale/ui/progress_figure.py) on a canvas, from the points the kernel sends (nbscale/ui/live_figure.py).
// The kernel sends only the points added since its last message ({type: "points"}, a float64 buffer per column);
// a view that opens says "ready", and the kernel's next message ({type: "reset"}) carries every point. The axis
// rules are the PNG's:
// iterations 0..total (an unknown length widens to a round number), accuracy 0..100, other panels fitted to
// their values and refitted when a value leaves them, epochs as alternating bands labelled along the top,
// learn-rate drops and restarts marked, legends in a column right of the panels.

const WIDTH = 756; // the PNG's 10.5 inches at 72 dpi
const MARGIN = { left: 52, right: 122, top: 30, bottom: 34 }; // the PNG's subplots_adjust, in pixels
const RECENT = 300; // a fitted axis follows the last RECENT training points (and every validation point)
const MAX_EPOCH_BANDS = 100;
const MAX_LABELS = 12;
const GRID = "rgba(176,176,176,0.3)";
const BAND = "#f0f0f0";
const DROP = "#6a3d9a";
const RESTART = "#c00000";
const FONT = "10px sans-serif";

function roundUp(value) {
  // the smallest of 1, 2, 2.5 and 5 times a power of ten that is at least `value` (progress_figure._round_up)
  if (value <= 0) return 0;
  const power = 10 ** Math.floor(Math.log10(value));
  return [1, 2, 2.5, 5, 10].map((step) => power * step).find((v) => v >= value * (1 - 1e-12));
}

function ticks(low, high, log) {
  if (log) {
    const out = [];
    for (let e = Math.floor(Math.log10(low)); e <= Math.ceil(Math.log10(high)); e++) out.push(10 ** e);
    return out.filter((v) => v >= low && v <= high);
  }
  const step = roundUp((high - low) / 6) || 1;
  const out = [];
  for (let v = Math.ceil(low / step) * step; v <= high + step * 1e-9; v += step) out.push(Number(v.toPrecision(12)));
  return out;
}

function shown(value) {
  return Math.abs(value) >= 1e5 || (value !== 0 && Math.abs(value) < 1e-3)
    ? value.toExponential(1)
    : String(Number(value.toPrecision(4)));
}

function xValues(c, series, length) {
  // the x values of a series' `length` points (progress_figure._x_column: its last `length` values)
  const x = c[`${series.key}_iteration`] ?? (series.kind === "validation" ? c.val_iteration : c.iteration) ?? [];
  return length ? x.slice(-length) : [];
}

function lastIteration(c) {
  let last = 0;
  for (const [key, column] of Object.entries(c)) {
    if (key.endsWith("iteration") && column.length) last = Math.max(last, column[column.length - 1]);
  }
  return last;
}

function fitX(view, layout, c, progress) {
  // the iteration axis' end (progress_figure.ProgressFigure._fit_limits)
  const last = lastIteration(c);
  let end;
  if (layout.total) end = last;
  else if (progress !== null && progress >= 1 && progress < 100) end = roundUp(Math.max((last * 100) / progress, last));
  else end = last > view.right ? roundUp(Math.max(2 * view.right, last * 1.25)) : view.right;
  view.right = Math.max(view.right, end);
}

function fitY(view, index, panel, c) {
  // a fitted panel's limits, widened when a value leaves them (progress_figure.ProgressFigure._fit_limits)
  if (panel.limits) return panel.limits;
  const limits = view.limits[index] ?? { range: panel.log ? [0.1, 1] : [0, 1], fitted: false };
  view.limits[index] = limits;
  const recent = [];
  let top = 0;
  for (const series of panel.series) {
    const column = c[series.key] ?? [];
    for (const v of series.kind === "train" ? column.slice(-RECENT) : column) recent.push(v);
    for (const v of column) if (Number.isFinite(v) && v > top) top = v;
  }
  const values = recent.filter((v) => Number.isFinite(v) && (v > 0 || !panel.log));
  if (!values.length) return limits.range;
  const low = values.reduce((a, b) => Math.min(a, b));
  const high = values.reduce((a, b) => Math.max(a, b));
  if (!limits.fitted || low < limits.range[0] || high > limits.range[1]) {
    limits.fitted = true;
    top = Math.max(high, top);
    const bottom = Math.min(0, low * 1.15);
    limits.range = panel.log ? [low / 1.5, top * 1.5] : [bottom, Math.max(top * 1.15, bottom + 1e-6)];
  }
  return limits.range;
}

function line(ctx, xs, ys, x, y) {
  // a polyline broken at missing values, as matplotlib breaks a line at NaN
  ctx.beginPath();
  let drawing = false;
  for (let i = 0; i < ys.length; i++) {
    if (!Number.isFinite(ys[i])) {
      drawing = false;
      continue;
    }
    if (drawing) ctx.lineTo(x(xs[i]), y(ys[i]));
    else ctx.moveTo(x(xs[i]), y(ys[i]));
    drawing = true;
  }
  ctx.stroke();
}

function epochMarks(ctx, layout, box, x) {
  const epochs = Math.floor(layout.total / Math.max(layout.per_epoch, 1));
  if (!layout.total) return;
  if (epochs > 1 && epochs <= MAX_EPOCH_BANDS) {
    ctx.fillStyle = BAND;
    for (let e = 1; e < epochs; e += 2) {
      const from = x(e * layout.per_epoch + 0.5);
      ctx.fillRect(from, box.top, x(Math.min(e + 1, epochs) * layout.per_epoch + 0.5) - from, box.height);
    }
    return;
  }
  const step = Math.max(1, Math.ceil(epochs / MAX_EPOCH_BANDS));
  ctx.strokeStyle = "#d9d9d9";
  for (let e = step; e < epochs; e += step) vertical(ctx, x(e * layout.per_epoch + 0.5), box, 0.8, []);
}

function vertical(ctx, at, box, width, dash) {
  ctx.lineWidth = width;
  ctx.setLineDash(dash);
  ctx.beginPath();
  ctx.moveTo(at, box.top);
  ctx.lineTo(at, box.top + box.height);
  ctx.stroke();
  ctx.setLineDash([]);
}

function label(ctx, text, at, y, colour, fromTop) {
  // a mark's label, rotated as the PNG's (reading upwards), beside its line
  ctx.save();
  ctx.translate(at + 3, y);
  ctx.rotate(-Math.PI / 2);
  ctx.fillStyle = colour;
  ctx.font = "7.5px sans-serif";
  ctx.textAlign = fromTop ? "right" : "left";
  ctx.textBaseline = "top";
  ctx.fillText(text, 0, 0);
  ctx.restore();
}

function marks(ctx, c, boxes, x) {
  // learn-rate drops (dashed, labelled in the last panel) and restarts (dash-dot, labelled in the first)
  const drops = c.drop_iteration ?? [];
  const restarts = c.restart_iteration ?? [];
  boxes.forEach((box, index) => {
    ctx.strokeStyle = DROP;
    drops.forEach((it) => vertical(ctx, x(it - 0.5), box, 1, [4, 2]));
    ctx.strokeStyle = RESTART;
    restarts.forEach((it) => vertical(ctx, x(it + 0.5), box, 1.2, [6, 2, 1, 2]));
    if (index === boxes.length - 1) {
      drops.slice(0, MAX_LABELS).forEach((it, i) => {
        label(ctx, `learn rate ${Number((c.drop_rate ?? [])[i]).toPrecision(3)}`, x(it - 0.5), box.top + 3, DROP, true);
      });
    }
    if (index === 0) {
      restarts.forEach((it, i) => label(ctx, `restart ${i + 1}`, x(it + 0.5), box.top + box.height - 3, RESTART, false));
    }
  });
}

function series(ctx, c, panel, x, y) {
  for (const s of panel.series) {
    const ys = c[s.key] ?? [];
    const xs = xValues(c, s, ys.length);
    if (s.kind === "validation") {
      ctx.strokeStyle = "black";
      ctx.fillStyle = "black";
      ctx.lineWidth = 1;
      ctx.setLineDash([4, 2]);
      line(ctx, xs, ys, x, y);
      ctx.setLineDash([]);
      ys.forEach((v, i) => {
        if (!Number.isFinite(v)) return;
        ctx.beginPath();
        ctx.arc(x(xs[i]), y(v), 2, 0, 2 * Math.PI);
        ctx.fill();
      });
      continue;
    }
    const smooth = c[`${s.key}_smooth`] ?? [];
    ctx.strokeStyle = s.colours[0];
    ctx.lineWidth = 1;
    line(ctx, xs, ys, x, y);
    ctx.strokeStyle = s.colours[1];
    ctx.lineWidth = 1.8;
    line(ctx, xValues(c, s, smooth.length), smooth, x, y);
  }
}

function legend(ctx, panel, box) {
  let row = box.top + 6;
  ctx.font = "8px sans-serif";
  ctx.textBaseline = "middle";
  ctx.textAlign = "left";
  const entry = (text, colour, width, dash, dot) => {
    ctx.strokeStyle = colour;
    ctx.lineWidth = width;
    ctx.setLineDash(dash);
    ctx.beginPath();
    ctx.moveTo(box.right + 8, row);
    ctx.lineTo(box.right + 26, row);
    ctx.stroke();
    ctx.setLineDash([]);
    if (dot) {
      ctx.fillStyle = colour;
      ctx.beginPath();
      ctx.arc(box.right + 17, row, 2, 0, 2 * Math.PI);
      ctx.fill();
    }
    ctx.fillStyle = "black";
    ctx.fillText(text, box.right + 30, row);
    row += 12;
  };
  for (const s of panel.series) {
    if (s.kind === "validation") entry(s.label, "black", 1, [4, 2], true);
    else {
      entry(s.label, s.colours[0], 1, [], false);
      entry(`${s.label} (smoothed)`, s.colours[1], 1.8, [], false);
    }
  }
}

function yAxis(ctx, panel, box, range, y) {
  ctx.font = FONT;
  ctx.fillStyle = "black";
  ctx.textAlign = "right";
  ctx.textBaseline = "middle";
  ctx.strokeStyle = GRID;
  ctx.lineWidth = 0.8;
  for (const v of ticks(range[0], range[1], panel.log)) {
    ctx.beginPath();
    ctx.moveTo(box.left, y(v));
    ctx.lineTo(box.right, y(v));
    ctx.stroke();
    ctx.fillText(shown(v), box.left - 4, y(v));
  }
  ctx.save();
  ctx.translate(12, box.top + box.height / 2);
  ctx.rotate(-Math.PI / 2);
  ctx.textAlign = "center";
  ctx.fillText(panel.label, 0, 0);
  ctx.restore();
}

function xAxis(ctx, layout, boxes, view, x) {
  const last = boxes[boxes.length - 1];
  ctx.font = FONT;
  ctx.fillStyle = "black";
  ctx.textAlign = "center";
  ctx.textBaseline = "top";
  for (const v of ticks(0, view.right, false)) {
    ctx.strokeStyle = GRID;
    boxes.forEach((box) => vertical(ctx, x(v), box, 0.8, []));
    ctx.fillText(shown(v), x(v), last.top + last.height + 4);
  }
  ctx.fillText(layout.x_label, (last.left + last.right) / 2, last.top + last.height + 18);
  const epochs = Math.floor(layout.total / Math.max(layout.per_epoch, 1));
  if (!layout.total || epochs < 1) return;
  const step = Math.max(1, Math.ceil(epochs / MAX_LABELS));
  ctx.font = "8px sans-serif";
  ctx.textBaseline = "bottom";
  for (let e = 1; e <= epochs; e += step) ctx.fillText(String(e), x((e - 0.5) * layout.per_epoch + 0.5), boxes[0].top - 2);
  ctx.font = "9px sans-serif";
  ctx.fillText("Epoch", (last.left + last.right) / 2, boxes[0].top - 12);
}

function draw(canvas, view, layout, c, progress) {
  const n = layout.panels.length;
  const height = Math.round(72 * (n > 2 ? 1.2 + 2 * n : 5.2));
  const ratio = window.devicePixelRatio || 1;
  if (canvas.width !== WIDTH * ratio || canvas.height !== height * ratio) {
    canvas.width = WIDTH * ratio;
    canvas.height = height * ratio;
    canvas.style.width = `${WIDTH}px`;
    canvas.style.height = `${height}px`;
  }
  const ctx = canvas.getContext("2d");
  ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
  ctx.fillStyle = "white";
  ctx.fillRect(0, 0, WIDTH, height);
  fitX(view, layout, c, progress);
  const left = MARGIN.left;
  const right = WIDTH - MARGIN.right;
  const inner = height - MARGIN.top - MARGIN.bottom;
  const panelHeight = inner / (n + 0.1 * (n - 1)); // matplotlib's hspace 0.1: a gap of 0.1 panel heights
  const boxes = layout.panels.map((_, i) => ({
    left,
    right,
    top: MARGIN.top + i * 1.1 * panelHeight,
    height: panelHeight,
  }));
  const x = (v) => left + (v / Math.max(view.right, 1)) * (right - left);
  layout.panels.forEach((panel, i) => epochMarks(ctx, layout, boxes[i], x));
  xAxis(ctx, layout, boxes, view, x);
  marks(ctx, c, boxes, x);
  layout.panels.forEach((panel, i) => {
    const box = boxes[i];
    const range = fitY(view, i, panel, c);
    const scale = panel.log ? Math.log10 : (v) => v;
    const y = (v) => box.top + box.height - ((scale(v) - scale(range[0])) / (scale(range[1]) - scale(range[0]))) * box.height;
    yAxis(ctx, panel, box, range, y);
    ctx.save();
    ctx.beginPath();
    ctx.rect(box.left, box.top, box.right - box.left, box.height);
    ctx.clip();
    series(ctx, c, panel, x, y);
    ctx.restore();
    ctx.strokeStyle = "black";
    ctx.lineWidth = 0.8;
    ctx.strokeRect(box.left, box.top, box.right - box.left, box.height);
    legend(ctx, panel, box);
  });
}

export default {
  render({ model, el }) {
    const canvas = document.createElement("canvas");
    canvas.className = "nbscale-live-figure";
    canvas.style.display = "block";
    el.appendChild(canvas);
    const view = { right: 1, limits: {} };
    let columns = {};
    let progress = null;
    let pending = false;
    const redraw = () => {
      if (pending) return;
      pending = true;
      requestAnimationFrame(() => {
        pending = false;
        draw(canvas, view, model.get("spec"), columns, progress);
      });
    };
    const reset = () => {
      const layout = model.get("spec");
      Object.assign(view, { right: Math.max(layout.total, 1), limits: {} });
      columns = {};
    };
    const receive = (message, buffers) => {
      // one buffer of float64 per key (NaN where a value is missing), in the order of message.keys
      if (message.type === "reset") reset();
      message.keys.forEach((key, i) => {
        const view = buffers[i];
        const copy = view.buffer.slice(view.byteOffset, view.byteOffset + view.byteLength); // aligned for Float64Array
        columns[key] = (columns[key] ?? []).concat(Array.from(new Float64Array(copy)));
      });
      progress = message.progress ?? null;
      redraw();
    };
    const relayout = () => {
      view.limits = {};
      redraw();
    };
    reset();
    model.on("msg:custom", receive);
    model.on("change:spec", relayout);
    model.send({ type: "ready" });
    redraw();
    return () => {
      model.off("msg:custom", receive);
      model.off("change:spec", relayout);
    };
  },
};
