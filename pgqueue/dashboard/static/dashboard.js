// The queues page's live charts: polls the series endpoint and draws each line as SVG.
// Values are set with textContent and attributes only, never as HTML.
"use strict";

const SVG = "http://www.w3.org/2000/svg";
const COLORS = ["#2f6fde", "#c0392b", "#1e8449", "#8a5a00", "#7d3c98", "#117a8b", "#5b6673", "#d35400"];

const LEFT = 44, RIGHT = 12, TOP = 10, BOTTOM = 24;  // room for the axes' labels
const TICK_SPACING = 110;  // pixels per time label, so that labels never overlap

function text(svg, x, y, value, anchor, cls) {
  const label = document.createElementNS(SVG, "text");
  label.setAttribute("x", x);
  label.setAttribute("y", y);
  label.setAttribute("font-size", "11");
  label.setAttribute("fill", "#5b6673");
  label.setAttribute("text-anchor", anchor);
  label.setAttribute("class", cls);
  label.textContent = value;
  svg.appendChild(label);
}

function rule(svg, x1, y1, x2, y2) {
  const line = document.createElementNS(SVG, "line");
  line.setAttribute("x1", x1);
  line.setAttribute("y1", y1);
  line.setAttribute("x2", x2);
  line.setAttribute("y2", y2);
  line.setAttribute("stroke", "#d9dee4");
  line.setAttribute("stroke-width", "1");
  svg.appendChild(line);
}

// Times are labelled in UTC, as every other time of the dashboard.
function clock(ms) {
  return new Date(ms).toISOString().slice(11, 19);
}

function number(value) {
  return value.toFixed(value < 10 && !Number.isInteger(value) ? 2 : 0);
}

function axes(svg, size, first, span, top, x) {
  const bottom = size.height - BOTTOM;
  rule(svg, LEFT, bottom, size.width - RIGHT, bottom);
  rule(svg, LEFT, TOP, size.width - RIGHT, TOP);
  text(svg, LEFT - 4, TOP + 4, number(top), "end", "value-label");
  text(svg, LEFT - 4, bottom + 4, "0", "end", "value-label");
  const room = Math.floor((size.width - LEFT - RIGHT) / TICK_SPACING) + 1;
  const ticks = span > 1 ? Math.max(2, Math.min(6, room)) : 1;
  for (let i = 0; i < ticks; i++) {
    const at = ticks === 1 ? first : first + (span * i) / (ticks - 1);
    const anchor = i === 0 ? "start" : i === ticks - 1 ? "end" : "middle";
    rule(svg, x(at), bottom, x(at), bottom + 4);
    text(svg, x(at), size.height - 6, clock(at), anchor, "time-label");
  }
  text(svg, 2, size.height - 6, "UTC", "start", "axis-unit");
}

function draw(svg, times, lines) {
  while (svg.firstChild) svg.removeChild(svg.firstChild);
  if (!times.length) return;
  // One unit a pixel, so that labels keep their size however wide the chart is drawn.
  const size = { width: svg.clientWidth || 600, height: svg.clientHeight || 160 };
  svg.setAttribute("viewBox", `0 0 ${size.width} ${size.height}`);
  const values = lines.flatMap((l) => l.values.filter((v) => v !== null));
  const top = Math.max(1, ...values);
  const first = times[0], span = Math.max(1, times[times.length - 1] - first);
  const x = (t) => LEFT + ((t - first) / span) * (size.width - LEFT - RIGHT);
  const y = (v) => size.height - BOTTOM - (v / top) * (size.height - BOTTOM - TOP);
  axes(svg, size, first, span, top, x);
  lines.forEach((line, i) => {
    const points = [];
    line.values.forEach((v, j) => { if (v !== null) points.push(`${x(times[j]).toFixed(1)},${y(v).toFixed(1)}`); });
    const path = document.createElementNS(SVG, "polyline");
    path.setAttribute("points", points.join(" "));
    path.setAttribute("fill", "none");
    path.setAttribute("stroke", COLORS[i % COLORS.length]);
    path.setAttribute("stroke-width", "2");
    path.dataset.series = line.name;
    svg.appendChild(path);
  });
}

function legend(element, names) {
  element.textContent = "";
  names.forEach((name, i) => {
    const item = document.createElement("span");
    item.style.color = COLORS[i % COLORS.length];
    item.textContent = `■ ${name}  `;
    element.appendChild(item);
  });
}

function chart(name, times, lines) {
  draw(document.getElementById(`chart-${name}`), times, lines);
  legend(document.getElementById(`legend-${name}`), lines.map((l) => l.name));
}

async function refresh(section) {
  try {
    const reply = await fetch(section.dataset.series, { credentials: "same-origin" });
    if (!reply.ok) return;
    const data = await reply.json();
    chart("throughput", data.at, [
      { name: "succeeded/s", values: data.done_per_second },
      { name: "failed/s", values: data.failed_per_second },
    ]);
    chart("depth", data.at, Object.keys(data.depth).map((s) => ({ name: s, values: data.depth[s] })));
    chart("claim", data.at, [{ name: "claim ms", values: data.claim_ms_p50 }]);
    section.dataset.samples = String(data.at.length);
  } catch (error) {
    section.dataset.error = String(error);
  }
}

// Tables marked data-live are read again from the server, escaped as every page is, and
// swapped in: the page stays live without a reload.
async function refreshTables() {
  const live = document.querySelectorAll("table[data-live]");
  if (!live.length) return;
  try {
    const reply = await fetch(window.location.href, { credentials: "same-origin" });
    if (!reply.ok) return;
    const fresh = new DOMParser().parseFromString(await reply.text(), "text/html");
    live.forEach((table) => {
      const replacement = fresh.getElementById(table.id);
      if (replacement) table.replaceWith(document.importNode(replacement, true));
    });
  } catch (error) {
    document.body.dataset.refreshError = String(error);
  }
}

document.addEventListener("DOMContentLoaded", () => {
  const section = document.querySelector("section.charts");
  if (section) {
    refresh(section);
    setInterval(() => refresh(section), 2000);
  }
  setInterval(refreshTables, 5000);
});
