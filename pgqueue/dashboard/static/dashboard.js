// The queues page's live charts: polls the series endpoint and draws each line as SVG.
// Values are set with textContent and attributes only, never as HTML.
"use strict";

const SVG = "http://www.w3.org/2000/svg";
const COLORS = ["#2f6fde", "#c0392b", "#1e8449", "#8a5a00", "#7d3c98", "#117a8b", "#5b6673", "#d35400"];

function draw(svg, times, lines) {
  while (svg.firstChild) svg.removeChild(svg.firstChild);
  const width = 600, height = 160, pad = 24;
  const values = lines.flatMap((l) => l.values.filter((v) => v !== null));
  const top = Math.max(1, ...values);
  const first = times[0], span = Math.max(1, times[times.length - 1] - first);
  const x = (t) => pad + ((t - first) / span) * (width - 2 * pad);
  const y = (v) => height - pad - (v / top) * (height - 2 * pad);
  const axis = document.createElementNS(SVG, "text");
  axis.setAttribute("x", 2);
  axis.setAttribute("y", 12);
  axis.setAttribute("font-size", "11");
  axis.setAttribute("fill", "#5b6673");
  axis.textContent = top.toFixed(top < 10 ? 2 : 0);
  svg.appendChild(axis);
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
