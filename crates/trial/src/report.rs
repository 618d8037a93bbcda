//! The trial report: one static, self-contained HTML page that replays two recorded trials
//! (an accepted controller and a draft) of any `plimsoll-sim/1` simulator from their
//! trajectories, charted from the simulator's metadata, with how each trial ended, its score,
//! the controllers' sources, fingerprints, digests and what the page does not claim
//! (docs/trials.md, "The report").
//!
//! The page loads nothing: inline CSS and JS, a Content-Security-Policy of `default-src 'none'`
//! that admits only the page's own script (by its SHA-256), and no physics in the browser: the
//! replay only reads the recorded states. Every string from the input (the metadata's too) is
//! HTML-escaped and appears only as element text or a quoted attribute value; the script's data
//! holds numbers and fixed strings only.

use std::fmt::Write as _;

use base64::Engine as _;
use sha2::{Digest as _, Sha256};

use crate::sim::Metadata;
use crate::trajectory::{decode, record_bytes};
use crate::verdict::SimulatorJson;

/// One recorded run, as the report shows it: the trajectory and what the verdict said of it.
#[derive(Debug, Clone)]
pub struct RunInput {
    /// A short name ("accepted.js", "failing.py").
    pub label: String,
    /// The controller's source (untrusted text; escaped on the page).
    pub controller_source: String,
    /// The trajectory file's bytes: per tick the metadata's state values, then its action
    /// values, little-endian doubles (docs/trials.md, "Trajectory").
    pub trajectory: Vec<u8>,
    /// The verdict's fingerprint (lowercase hex SHA-256 of the trajectory).
    pub fingerprint: String,
    /// The verdict's `ticks`.
    pub ticks: u64,
    /// The verdict's `pass` for this trial.
    pub pass: bool,
    /// The verdict's `end_reason` (`completed`, `failed`, `controller_timeout`, ...).
    pub end_reason: String,
    /// The verdict's `detail`: the simulator's reason, or the controller's fault.
    pub detail: Option<String>,
    /// The verdict's `failed_at_tick`: the step after which the simulator failed the trial.
    pub failed_at_tick: Option<u64>,
    /// The verdict's `score`, for a simulator that scores.
    pub score: Option<f64>,
    /// The scenario's `min_score`, as the verdict repeats it.
    pub min_score: Option<f64>,
    /// The verdict's `final_state` in the metadata's order (the state after the last step,
    /// which the trajectory does not hold); empty if unknown.
    pub final_state: Vec<f64>,
    /// The provider that ran it.
    pub provider: String,
    /// The isolation tier the result states.
    pub tier: String,
    /// SHA-256 of the request, as the client recomputed it.
    pub request_sha256: String,
    /// SHA-256 of the result, as the client recomputed it.
    pub result_sha256: String,
}

/// One trial of a run, read from the run's answer (`RunResponse`): the verdict its trial step
/// `step` printed (its last stdout line), that verdict's trial `trial`, and the trajectory
/// artifact the trial wrote. Gives the simulator the verdict names (its metadata checked as
/// the runner checks it) and the run as the page shows it; `Err` says what is missing.
pub fn from_response(
    label: &str,
    controller_source: &str,
    resp: &plimsoll_wire::RunResponse,
    step: usize,
    trial: usize,
) -> Result<(SimulatorJson, RunInput), String> {
    let ran = resp
        .result
        .steps
        .get(step)
        .ok_or_else(|| format!("{label}: the run has no step {}", step + 1))?;
    let stdout = ran.stdout.to_string_lossy();
    let line = stdout
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("");
    let verdict: serde_json::Value = serde_json::from_str(line)
        .map_err(|e| format!("{label}: step {} printed no verdict ({e})", step + 1))?;
    let s = &verdict["simulator"];
    let text = |key: &str| {
        s[key]
            .as_str()
            .map(str::to_owned)
            .ok_or_else(|| format!("{label}: the verdict's simulator has no {key}"))
    };
    let metadata = Metadata::parse(s["metadata"].to_string().as_bytes())
        .map_err(|e| format!("{label}: the verdict's simulator metadata is not valid: {e}"))?;
    let t = &verdict["trials"][trial];
    let path = t["trajectory"]
        .as_str()
        .ok_or_else(|| format!("{label}: the verdict has no trial {}", trial + 1))?;
    // The trajectory as the run returned it: the artifact of the path the verdict names
    // (relative to /work, as the step ran there).
    let wanted = path.trim_start_matches("./").trim_start_matches("/work/");
    let artifact = resp
        .result
        .artifacts
        .iter()
        .find(|a| a.found && a.path.trim_start_matches("./") == wanted)
        .ok_or_else(|| {
            format!("{label}: the run returned no artifact {wanted} (the trial's trajectory)")
        })?;
    let run = RunInput {
        label: label.to_owned(),
        controller_source: controller_source.to_owned(),
        trajectory: artifact.content.as_slice().to_vec(),
        fingerprint: t["fingerprint"].as_str().unwrap_or("").to_owned(),
        ticks: t["ticks"].as_u64().unwrap_or(0),
        pass: t["pass"].as_bool().unwrap_or(false),
        end_reason: t["end_reason"].as_str().unwrap_or("").to_owned(),
        detail: t["detail"].as_str().map(str::to_owned),
        failed_at_tick: t["failed_at_tick"].as_u64(),
        score: t["score"].as_f64(),
        min_score: t["min_score"].as_f64(),
        // The page leaves out a final state it is not given whole.
        final_state: metadata
            .state
            .iter()
            .map_while(|v| t["final_state"][&v.name].as_f64())
            .collect(),
        provider: resp.provider.clone(),
        tier: resp.isolation.to_string(),
        request_sha256: resp.request_sha256.clone(),
        result_sha256: resp.result_sha256.clone(),
    };
    let sim = SimulatorJson {
        name: text("name")?,
        version: text("version")?,
        sha256: text("sha256")?,
        metadata,
    };
    Ok((sim, run))
}

/// What the report shows.
#[derive(Debug, Clone)]
pub struct ReportInput {
    /// The page's heading.
    pub title: String,
    /// The simulator both runs ran under, as the verdict names it: its metadata says how to
    /// read the trajectories and what to chart.
    pub simulator: SimulatorJson,
    /// The accepted controller's run.
    pub accepted: RunInput,
    /// The draft's run.
    pub draft: RunInput,
    /// The fingerprint of a repeated run of the accepted controller, if there was one.
    pub accepted_repeat_fingerprint: Option<String>,
}

/// Where two trajectories first differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Divergence {
    /// The first record (tick) whose bytes differ, or where one trajectory ends before the
    /// other; None when the two are identical.
    pub record: Option<usize>,
    /// The first tick whose state (the record's state values) differs, or where one
    /// trajectory ends; None when every state is the same.
    pub state: Option<usize>,
}

/// Compares two trajectories of records of `state` state values and `action` action values.
pub fn divergence(a: &[u8], b: &[u8], state: usize, action: usize) -> Divergence {
    let size = record_bytes(state, action);
    if size == 0 {
        let differ = (a != b).then_some(0);
        return Divergence {
            record: differ,
            state: differ,
        };
    }
    let ra: Vec<&[u8]> = a.chunks(size).collect();
    let rb: Vec<&[u8]> = b.chunks(size).collect();
    let first = |width: usize| -> Option<usize> {
        let common = ra.len().min(rb.len());
        (0..common)
            .find(|&k| ra[k][..width.min(ra[k].len())] != rb[k][..width.min(rb[k].len())])
            .or((ra.len() != rb.len()).then_some(common))
    };
    Divergence {
        record: first(size),
        state: first(8 * state),
    }
}

/// Escapes text for HTML element content and quoted attribute values.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// True when the simulator is the cart-pole, whose own view (a cart and a pole on a track)
/// the page can draw: chosen by the simulator's name and state variables, nothing else.
fn is_cartpole(m: &Metadata) -> bool {
    m.name == "cartpole"
        && m.state
            .iter()
            .map(|v| v.name.as_str())
            .eq(["x", "x_dot", "theta", "theta_dot"])
        && !m.action.is_empty()
}

/// One run's trajectory, decoded.
struct Decoded {
    /// Whole records, each the state values then the action values.
    records: Vec<(Vec<f64>, Vec<f64>)>,
    /// Bytes after the last whole record.
    stray: usize,
}

fn decoded(bytes: &[u8], n: usize, m: usize) -> Decoded {
    let size = record_bytes(n, m);
    if size == 0 {
        return Decoded {
            records: Vec::new(),
            stray: bytes.len(),
        };
    }
    let whole = bytes.len() / size * size;
    Decoded {
        records: decode(&bytes[..whole], n, m).unwrap_or_default(),
        stray: bytes.len() - whole,
    }
}

/// A number as JSON: Rust's `{}` (shortest round-trip, no exponent), null if not finite.
fn json_number(v: f64) -> String {
    if v.is_finite() {
        format!("{v}")
    } else {
        "null".to_owned()
    }
}

fn badge(same: bool) -> &'static str {
    if same {
        r#"<span class="badge same">identical</span>"#
    } else {
        r#"<span class="badge differs">differs</span>"#
    }
}

/// The two runs' colours (the canvas's; the same as `.run-0`, `.run-1`, `.sw0`, `.sw1` in
/// [`STYLE`]).
const COLOURS: [&str; 2] = ["#1f6fd1", "#e0701b"];
const CHART_W: f64 = 574.0;
const CHART_H: f64 = 196.0;

/// A step of 1, 2 or 5 times a power of ten that cuts `span` into about `parts` parts.
fn nice_step(span: f64, parts: f64) -> f64 {
    let raw = (span / parts).abs();
    if !(raw.is_finite() && raw > 0.0) {
        return 1.0;
    }
    let mag = 10f64.powf(raw.log10().floor());
    let norm = raw / mag;
    let f = if norm <= 1.0 {
        1.0
    } else if norm <= 2.0 {
        2.0
    } else if norm <= 5.0 {
        5.0
    } else {
        10.0
    };
    f * mag
}

/// An axis label for `v` on an axis of step `step`.
fn axis_label(v: f64, step: f64) -> String {
    // A grid value that is zero but for rounding (lo + k * step).
    if v.abs() < step * 1e-6 {
        return "0".to_owned();
    }
    if step < 1e-4 || v.abs() >= 1e6 {
        return format!("{v:.1e}");
    }
    let decimals = (-step.log10().floor()).clamp(0.0, 8.0) as usize;
    format!("{v:.decimals$}")
}

/// A unit as the page shows it after a value: none for `""` or `"1"` (a plain number, a
/// fraction: docs/simulators.md).
fn shown_unit(unit: &str) -> Option<&str> {
    (!unit.is_empty() && unit != "1").then_some(unit)
}

/// A value for the runs table, with its unit.
fn value_with_unit(v: f64, unit: &str) -> String {
    match shown_unit(unit) {
        Some(u) => format!("{} {}", json_number(v), escape(u)),
        None => json_number(v),
    }
}

/// One line of a chart: points (tick, value), and whether the run failed at its last point.
struct Series {
    points: Vec<(f64, f64)>,
    failed: bool,
}

/// The y range of a chart: the data's, padded, or for an action its bounds, widened to the
/// data but not past half a bound-width beyond them (the trajectory records the answers
/// before the runner's clamp, so a wild answer would flatten everything else; the caller
/// draws a point outside on the edge). Always finite with `lo < hi`.
fn y_range(series: &[Series], bounds: Option<(f64, f64)>) -> (f64, f64) {
    let values = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1))
        .filter(|v| v.is_finite());
    let (dmin, dmax) = values.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
        (lo.min(v), hi.max(v))
    });
    let (mut lo, mut hi) = match bounds {
        Some((bmin, bmax)) => {
            let span = (bmax - bmin) / 2.0;
            (
                bmin.min(dmin.max(bmin - span)),
                bmax.max(dmax.min(bmax + span)),
            )
        }
        None if dmin <= dmax => (dmin, dmax),
        None => (-1.0, 1.0),
    };
    let span = hi - lo;
    if span <= 1e-12 * lo.abs().max(hi.abs()) {
        let pad = if lo == 0.0 { 1.0 } else { lo.abs() * 0.1 };
        lo -= pad;
        hi += pad;
    } else {
        lo -= span * 0.04;
        hi += span * 0.04;
    }
    // Bounds or values near the limits of f64 (only from unchecked input): a plain axis.
    if lo.is_finite() && hi.is_finite() && lo < hi {
        (lo, hi)
    } else {
        (-1.0, 1.0)
    }
}

/// What one chart draws.
struct ChartSpec<'a> {
    /// `state` or `action`.
    kind: &'static str,
    /// The variable's index in its list.
    index: usize,
    /// The variable's name and unit (untrusted; escaped here).
    name: &'a str,
    unit: &'a str,
    /// An action's `[min, max]`.
    bounds: Option<(f64, f64)>,
    /// Ticks the x axis spans.
    domain: u64,
    /// Simulated ticks per second.
    tps: u32,
}

/// An inline SVG chart of one variable of both runs over ticks, with a replay cursor.
fn chart(spec: &ChartSpec, series: &[Series; 2]) -> String {
    let (l, r, t, b) = (52.0, 16.0, 26.0, 24.0);
    let (pw, ph) = (CHART_W - l - r, CHART_H - t - b);
    let domain = spec.domain.max(1) as f64;
    let xs = |k: f64| l + pw * k / domain;
    let (lo, hi) = y_range(series, spec.bounds);
    let step = nice_step(hi - lo, 4.0);
    let (lo, hi) = match ((lo / step).floor() * step, (hi / step).ceil() * step) {
        (nlo, nhi) if nlo.is_finite() && nhi.is_finite() && nlo < nhi => (nlo, nhi),
        _ => (lo, hi),
    };
    let clipped = series
        .iter()
        .flat_map(|s| &s.points)
        .any(|p| p.1 < lo || p.1 > hi);
    let ys = |v: f64| t + ph * (1.0 - (v.clamp(lo, hi) - lo) / (hi - lo));
    let name = escape(spec.name);
    let unit = escape(spec.unit);
    let shown = shown_unit(spec.unit).map_or(String::new(), |u| format!("[{}]", escape(u)));
    let (kind, index) = (spec.kind, spec.index);

    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg class="chart" id="chart-{kind}-{index}" data-kind="{kind}" data-index="{index}" viewBox="0 0 {CHART_W} {CHART_H}" width="{CHART_W}" height="{CHART_H}" role="img"><title>{kind} {name} ({unit})</title>"#
    );
    let _ = write!(
        s,
        r#"<text x="{l}" y="16" class="ct">{name}<tspan class="cu" dx="6">{shown}</tspan></text>"#
    );
    let note = match spec.bounds {
        Some((min, max)) if clipped => format!(
            "action, bounds {} to {}; answers beyond the chart drawn on its edge",
            json_number(min),
            json_number(max)
        ),
        Some((min, max)) => format!(
            "action, bounds {} to {}",
            json_number(min),
            json_number(max)
        ),
        None => "state".to_owned(),
    };
    let _ = write!(
        s,
        r##"<text x="{}" y="16" class="ck" text-anchor="end">{note}</text><rect x="{l}" y="{t}" width="{pw}" height="{ph}" class="plot"/>"##,
        l + pw
    );
    // Horizontal grid and labels.
    let count = ((hi - lo) / step).round().clamp(1.0, 20.0) as u32;
    for k in 0..=count {
        let v = lo + f64::from(k) * step;
        let y = ys(v);
        let class = if v.abs() < step * 1e-6 {
            "zero"
        } else {
            "grid"
        };
        let _ = write!(
            s,
            r#"<line x1="{l}" x2="{}" y1="{y:.1}" y2="{y:.1}" class="{class}"/><text x="{}" y="{:.1}" class="ax" text-anchor="end">{}</text>"#,
            l + pw,
            l - 5.0,
            y + 3.5,
            axis_label(v, step)
        );
    }
    // Vertical grid in simulated seconds.
    let tps = f64::from(spec.tps.max(1));
    let seconds = domain / tps;
    let xstep = nice_step(seconds, 6.0);
    let count = (seconds / xstep + 1e-9).floor() as u64;
    for k in 0..=count {
        let x = xs(k as f64 * xstep * tps);
        // The last label carries the unit.
        let unit = if k == count { " s" } else { "" };
        let _ = write!(
            s,
            r#"<line x1="{x:.1}" x2="{x:.1}" y1="{t}" y2="{}" class="grid"/><text x="{x:.1}" y="{}" class="ax" text-anchor="middle">{}{unit}</text>"#,
            t + ph,
            t + ph + 13.0,
            axis_label(k as f64 * xstep, xstep)
        );
    }
    if let Some((min, max)) = spec.bounds {
        for v in [min, max] {
            let y = ys(v);
            let _ = write!(
                s,
                r#"<line x1="{l}" x2="{}" y1="{y:.1}" y2="{y:.1}" class="bound"/>"#,
                l + pw
            );
        }
    }
    for (n, serie) in series.iter().enumerate() {
        let mut pts = String::new();
        for (k, v) in serie.points.iter().filter(|p| p.1.is_finite()) {
            let _ = write!(pts, "{:.1},{:.1} ", xs(*k), ys(*v));
        }
        let _ = write!(
            s,
            r#"<polyline class="run run-{n}" points="{}"/>"#,
            pts.trim_end()
        );
        if let (true, Some((k, v))) = (serie.failed, serie.points.last()) {
            let (x, y) = (xs(*k), ys(*v));
            let _ = write!(
                s,
                r#"<path class="end run-{n}" d="M{:.1},{:.1}l8,8m0,-8l-8,8"/>"#,
                x - 4.0,
                y - 4.0
            );
        }
    }
    let _ = write!(
        s,
        r#"<line class="cursor" x1="{l}" x2="{l}" y1="{t}" y2="{}" data-left="{l}" data-width="{pw}"/></svg>"#,
        t + ph
    );
    s
}

const STYLE: &str = r###"
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:14px 20px 40px;color:#222;background:#fff;max-width:1160px}
h1{font-size:21px;margin:0 0 4px}h2{font-size:16px;margin:22px 0 6px;border-bottom:1px solid #e3e3e3;padding-bottom:2px}h3{font-size:14px;margin:6px 0}
.sub{color:#555;margin:0 0 4px}.desc{color:#444;margin:0 0 8px;max-width:1000px}
.badge{display:inline-block;padding:0 7px;border-radius:9px;font-size:12px;font-weight:600;margin-left:6px}
.same,.pass{background:#d8f3dc;color:#1b5e20}.differs{background:#ffe0cc;color:#8a3b00}.nopass{background:#fde2e4;color:#b00020}
.pass,.nopass{margin-left:0}
.ok{color:#1b5e20}.bad{color:#b00020}.none{color:#888}
#replay{display:block;border:1px solid #ccc;background:#fff;margin:6px 0}
.controls{display:flex;gap:10px;align-items:center;margin:8px 0 4px}
.controls input[type=range]{flex:1}.controls button{min-width:64px}
.now{font-variant-numeric:tabular-nums;min-width:190px;text-align:right}
.charts{display:grid;grid-template-columns:repeat(2,574px);gap:10px;margin-top:8px}
.chart{background:#fff}
.chart text{font-family:system-ui,sans-serif}.chart .ct{font-size:13px;font-weight:600;fill:#222}.chart .cu{font-size:12px;fill:#666;font-weight:normal}
.chart .ck{font-size:11px;fill:#777}.chart .ax{font-size:10px;fill:#666}
.chart .plot{fill:#fcfcfc;stroke:#d4d4d4}.chart .grid{stroke:#ececec}.chart .zero{stroke:#aaa}
.chart .bound{stroke:#c33;stroke-dasharray:5 3}
.chart .run{fill:none;stroke-width:1.6;stroke-linejoin:round}.chart .end{fill:none;stroke-width:2.2}
.chart .run-0{stroke:#1f6fd1}.chart .run-1{stroke:#e0701b}.chart .cursor{stroke:#222;stroke-width:1}
.sw{display:inline-block;width:14px;height:4px;border-radius:2px;vertical-align:middle;margin-right:6px}
.sw0{background:#1f6fd1}.sw1{background:#e0701b}
table{border-collapse:collapse;margin:4px 0}td,th{border:1px solid #ddd;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#f7f7f7;font-weight:600}
#readout{font-variant-numeric:tabular-nums;display:block;overflow-x:auto}#readout td.num{text-align:right;min-width:84px;font-family:ui-monospace,"DejaVu Sans Mono",monospace;font-size:12px}
#readout .u{color:#777;font-weight:normal;font-size:12px}#readout td.status{min-width:200px}
.values{font-variant-numeric:tabular-nums}
code,.mono{font-family:ui-monospace,"DejaVu Sans Mono",monospace;font-size:12px;word-break:break-all}
pre{background:#f6f6f6;border:1px solid #ddd;padding:8px;overflow:auto;max-height:360px;font-size:12px}
.sources{display:flex;gap:12px}.sources>div{flex:1;min-width:0}
"###;

const SCRIPT: &str = r###"
(function () {
  "use strict";
  var errors = [];
  function fail(m) {
    errors.push(String(m));
    document.body.setAttribute("data-errors", errors.join(" | "));
    document.title = "JS ERROR: " + errors[0];
  }
  window.addEventListener("error", function (e) { fail(e.message || e); });
  function text(id) { var el = document.getElementById(id); return el ? el.textContent : ""; }
  try {
    var data = JSON.parse(document.getElementById("trajectories").textContent);
    var runs = data.runs, n = data.n, m = data.m, last = data.last;
    var labels = [text("label-0"), text("label-1")];
    var ends = [text("end-0"), text("end-1")];
    var slider = document.getElementById("slider");
    var button = document.getElementById("play");
    var out = document.getElementById("tick");
    var secs = document.getElementById("seconds");
    var cursors = document.querySelectorAll(".cursor");
    var canvas = data.view === "cartpole" ? document.getElementById("replay") : null;
    var ctx = canvas ? canvas.getContext("2d") : null;
    var decimals = Math.max(0, Math.ceil(Math.log(data.tps) / Math.LN10));
    var stride = Math.max(1, Math.round(last / 1000));
    slider.max = String(last);
    var tick = 0, timer = null;

    // Run r at tick k: the recorded state and action, or after its last record the final
    // state (the one its last action led to) and no action.
    function at(r, k) {
      var run = runs[r], recs = run.records;
      if (k < recs.length) {
        return { state: recs[k].slice(0, n), action: recs[k].slice(n), running: true };
      }
      var state = run.final !== null ? run.final : (recs.length ? recs[recs.length - 1].slice(0, n) : null);
      return { state: state, action: null, running: false };
    }
    function fmt(v) {
      if (v === null || v === undefined) { return "\u2013"; }
      return String(Number(v.toPrecision(6)));
    }

    // The cart-pole's own view: a cart on a 4.8 m track (it fails past 2.4 m) and its pole.
    var PX = 130, LIMIT_X = 2.4, POLE = 1.0;
    function cartpole(i, k) {
      var lane = canvas.height / 2, top = i * lane, cx0 = canvas.width / 2, ground = top + lane - 24;
      var now = at(i, k);
      ctx.fillStyle = "#222"; ctx.font = "bold 14px sans-serif"; ctx.textAlign = "left";
      ctx.fillText(labels[i], 12, top + 20);
      ctx.strokeStyle = "#888"; ctx.lineWidth = 2;
      ctx.beginPath(); ctx.moveTo(cx0 - (LIMIT_X + 0.2) * PX, ground + 12); ctx.lineTo(cx0 + (LIMIT_X + 0.2) * PX, ground + 12); ctx.stroke();
      ctx.strokeStyle = "#c33"; ctx.lineWidth = 1;
      [-LIMIT_X, LIMIT_X].forEach(function (lx) {
        ctx.beginPath(); ctx.moveTo(cx0 + lx * PX, ground - 30); ctx.lineTo(cx0 + lx * PX, ground + 18); ctx.stroke();
      });
      if (now.state === null) { ctx.fillText("no records", 12, top + 40); return; }
      var x = now.state[0], theta = now.state[2];
      var cx = cx0 + x * PX;
      ctx.fillStyle = data.colours[i];
      ctx.fillRect(cx - 30, ground - 10, 60, 22);
      ctx.fillStyle = "#333";
      ctx.beginPath(); ctx.arc(cx - 18, ground + 14, 5, 0, 7); ctx.arc(cx + 18, ground + 14, 5, 0, 7); ctx.fill();
      var px = cx + Math.sin(theta) * POLE * PX, py = ground - 10 - Math.cos(theta) * POLE * PX;
      ctx.strokeStyle = !now.running && runs[i].failed ? "#b00020" : "#5a3e1b"; ctx.lineWidth = 6; ctx.lineCap = "round";
      ctx.beginPath(); ctx.moveTo(cx, ground - 10); ctx.lineTo(px, py); ctx.stroke();
      ctx.fillStyle = "#222"; ctx.font = "12px monospace"; ctx.textAlign = "left";
      var status = now.running ? "tick " + k : ends[i] + " after tick " + runs[i].ticks;
      ctx.fillText(status + "   x = " + x.toFixed(3) + " m   theta = " + theta.toFixed(4) + " rad   " +
        text("name-action-0") + " = " + (now.action ? now.action[0].toFixed(3) + " " + text("unit-action-0") : "\u2013"), 12, top + 38);
    }

    function draw() {
      if (ctx) {
        ctx.clearRect(0, 0, canvas.width, canvas.height);
        ctx.strokeStyle = "#ddd"; ctx.lineWidth = 1;
        ctx.beginPath(); ctx.moveTo(0, canvas.height / 2); ctx.lineTo(canvas.width, canvas.height / 2); ctx.stroke();
        for (var i = 0; i < runs.length; i++) { cartpole(i, tick); }
      }
      for (var r = 0; r < runs.length; r++) {
        var now = at(r, tick);
        document.getElementById("status-" + r).textContent =
          now.running ? "running" : ends[r] + " after tick " + runs[r].ticks;
        for (var j = 0; j < n + m; j++) {
          var v = j < n ? (now.state ? now.state[j] : null) : (now.action ? now.action[j - n] : null);
          document.getElementById("v-" + r + "-" + j).textContent = fmt(v);
        }
      }
      slider.value = String(tick);
      out.textContent = String(tick);
      out.setAttribute("data-tick", String(tick));
      secs.textContent = (tick / data.tps).toFixed(decimals);
      for (var c = 0; c < cursors.length; c++) {
        var cl = cursors[c], left = Number(cl.getAttribute("data-left")), w = Number(cl.getAttribute("data-width"));
        var xx = left + w * tick / Math.max(last, 1);
        cl.setAttribute("x1", String(xx)); cl.setAttribute("x2", String(xx));
      }
      if (errors.length === 0) { document.title = "tick " + tick + " - " + data.title; }
    }

    function pause() { if (timer !== null) { clearInterval(timer); timer = null; } button.textContent = "Play"; }
    function play() {
      if (timer !== null) { return; }
      if (tick >= last) { tick = 0; }
      button.textContent = "Pause";
      timer = setInterval(function () {
        if (tick >= last) { pause(); return; }
        tick = Math.min(last, tick + stride); draw();
      }, 10);
    }
    button.addEventListener("click", function () { if (timer === null) { play(); } else { pause(); } });
    slider.addEventListener("input", function () { pause(); tick = Number(slider.value); draw(); });
    draw();
    play();
  } catch (e) {
    fail(e && e.stack ? e.stack : e);
  }
})();
"###;

/// Renders the report page.
pub fn render(input: &ReportInput) -> String {
    let sim = &input.simulator;
    let meta = &sim.metadata;
    let (n, m) = (meta.state.len(), meta.action.len());
    let tps = meta.ticks_per_second;
    let runs = [&input.accepted, &input.draft];
    let decs: Vec<Decoded> = runs.iter().map(|r| decoded(&r.trajectory, n, m)).collect();
    // The final state counts only if it has one value per state variable.
    let finals: Vec<Option<&[f64]>> = runs
        .iter()
        .map(|r| (r.final_state.len() == n && n > 0).then_some(r.final_state.as_slice()))
        .collect();
    let div = divergence(&input.accepted.trajectory, &input.draft.trajectory, n, m);
    // The x axis: every record, and the final state one tick after the last.
    let last = decs
        .iter()
        .zip(&finals)
        .map(|(d, f)| d.records.len() + usize::from(f.is_some()))
        .max()
        .unwrap_or(0)
        .saturating_sub(1);
    let cartpole = is_cartpole(meta);
    let e = |s: &str| escape(s);

    // The data the script reads: numbers and fixed strings only.
    let mut data = String::from("{\"runs\":[");
    for (k, ((run, dec), fin)) in runs.iter().zip(&decs).zip(&finals).enumerate() {
        if k > 0 {
            data.push(',');
        }
        let _ = write!(
            data,
            "{{\"ticks\":{},\"failed\":{},\"records\":[",
            run.ticks,
            run.failed_at_tick.is_some()
        );
        for (i, (state, action)) in dec.records.iter().enumerate() {
            if i > 0 {
                data.push(',');
            }
            data.push('[');
            for (j, v) in state.iter().chain(action).enumerate() {
                if j > 0 {
                    data.push(',');
                }
                data.push_str(&json_number(*v));
            }
            data.push(']');
        }
        data.push_str("],\"final\":");
        match fin {
            Some(values) => {
                data.push('[');
                for (j, v) in values.iter().enumerate() {
                    if j > 0 {
                        data.push(',');
                    }
                    data.push_str(&json_number(*v));
                }
                data.push(']');
            }
            None => data.push_str("null"),
        }
        data.push('}');
    }
    let _ = write!(
        data,
        "],\"n\":{n},\"m\":{m},\"tps\":{tps},\"last\":{last},\"view\":{},\"colours\":[\"{}\",\"{}\"],\"title\":\"plimsoll trial report\"}}",
        if cartpole { "\"cartpole\"" } else { "null" },
        COLOURS[0],
        COLOURS[1],
    );

    let script_hash =
        base64::engine::general_purpose::STANDARD.encode(Sha256::digest(SCRIPT.as_bytes()));
    let title = e(&input.title);

    let mut h = String::with_capacity(400_000 + data.len() * 2);
    let _ = write!(
        h,
        r#"<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; script-src 'sha256-{script_hash}'; style-src 'unsafe-inline'; img-src data:">
<meta name="referrer" content="no-referrer">
<title>{title}</title><style>{STYLE}</style></head>
<body data-errors="">
<h1 id="report-title">{title}</h1>
<p class="sub">Simulator <b id="simulator-name">{}</b> version <b id="simulator-version">{}</b>, SHA-256 <code id="simulator-sha256">{}</code>, {tps} ticks per simulated second. Replay of two recorded trials from their trajectories: nothing is simulated in this page.</p>
"#,
        e(&sim.name),
        e(&sim.version),
        e(&sim.sha256),
    );
    if let Some(d) = &meta.description {
        let _ = write!(
            h,
            "<p class=\"desc\" id=\"simulator-description\">{}</p>",
            e(d)
        );
    }

    // Replay: the simulator's own view where the page has one, the controls, the values.
    if cartpole {
        h.push_str(
            r#"<canvas id="replay" width="1160" height="340">The replay needs a canvas.</canvas>"#,
        );
    }
    let _ = write!(
        h,
        r#"<div class="controls"><button id="play" type="button">Pause</button>
<label for="slider">tick</label><input id="slider" type="range" min="0" max="{last}" value="0" step="1">
<span class="now">tick <output id="tick" data-tick="0">0</output> of {last}, <span id="seconds">0</span> s</span></div>
"#
    );
    h.push_str("<table id=\"readout\"><tr><th>run</th><th>at the cursor</th>");
    for (i, v) in meta.state.iter().enumerate() {
        let _ = write!(
            h,
            "<th><span id=\"name-state-{i}\">{}</span> <span class=\"u\" id=\"unit-state-{i}\">{}</span></th>",
            e(&v.name),
            e(shown_unit(&v.unit).unwrap_or(""))
        );
    }
    for (j, v) in meta.action.iter().enumerate() {
        let _ = write!(
            h,
            "<th><span id=\"name-action-{j}\">{}</span> <span class=\"u\" id=\"unit-action-{j}\">{}</span></th>",
            e(&v.name),
            e(shown_unit(&v.unit).unwrap_or(""))
        );
    }
    h.push_str("</tr>");
    for (r, run) in runs.iter().enumerate() {
        let _ = write!(
            h,
            "<tr><th><i class=\"sw sw{r}\"></i><span id=\"label-{r}\">{}</span></th><td class=\"status\" id=\"status-{r}\"></td>",
            e(&run.label)
        );
        for j in 0..n + m {
            let _ = write!(h, "<td class=\"num\" id=\"v-{r}-{j}\"></td>");
        }
        h.push_str("</tr>");
    }
    h.push_str("</table>\n<div class=\"charts\">");
    let domain = last as u64;
    for (i, v) in meta.state.iter().enumerate() {
        let series: [Series; 2] = std::array::from_fn(|r| {
            let mut points: Vec<(f64, f64)> = decs[r]
                .records
                .iter()
                .enumerate()
                .map(|(k, (s, _))| (k as f64, s[i]))
                .collect();
            if let Some(f) = finals[r] {
                points.push((decs[r].records.len() as f64, f[i]));
            }
            Series {
                points,
                failed: runs[r].failed_at_tick.is_some(),
            }
        });
        let spec = ChartSpec {
            kind: "state",
            index: i,
            name: &v.name,
            unit: &v.unit,
            bounds: None,
            domain,
            tps,
        };
        h.push_str(&chart(&spec, &series));
    }
    for (j, v) in meta.action.iter().enumerate() {
        let series: [Series; 2] = std::array::from_fn(|r| Series {
            points: decs[r]
                .records
                .iter()
                .enumerate()
                .map(|(k, (_, a))| (k as f64, a[j]))
                .collect(),
            failed: false,
        });
        let spec = ChartSpec {
            kind: "action",
            index: j,
            name: &v.name,
            unit: &v.unit,
            bounds: Some((v.min, v.max)),
            domain,
            tps,
        };
        h.push_str(&chart(&spec, &series));
    }
    h.push_str("</div>\n");

    // How each run ended, and the evidence.
    h.push_str("<h2>Runs</h2><table id=\"runs\"><tr><th></th>");
    for (r, run) in runs.iter().enumerate() {
        let _ = write!(h, "<th><i class=\"sw sw{r}\"></i>{}</th>", e(&run.label));
    }
    h.push_str("</tr>");
    let row = |h: &mut String, name: &str, cells: [String; 2]| {
        let _ = write!(
            h,
            "<tr><th>{name}</th><td>{}</td><td>{}</td></tr>",
            cells[0], cells[1]
        );
    };
    let both = |f: &dyn Fn(usize, &RunInput) -> String| [f(0, runs[0]), f(1, runs[1])];
    let none = "<span class=\"none\">none</span>";
    let same_fp = input.accepted.fingerprint == input.draft.fingerprint;
    row(
        &mut h,
        "provider",
        both(&|_, r| format!("<span class=\"provider\">{}</span>", e(&r.provider))),
    );
    row(
        &mut h,
        "isolation tier",
        both(&|_, r| format!("<span class=\"tier\">{}</span>", e(&r.tier))),
    );
    row(
        &mut h,
        "verdict",
        both(&|k, r| {
            if r.pass {
                format!("<span class=\"badge pass\" id=\"pass-{k}\">pass</span>")
            } else {
                format!("<span class=\"badge nopass\" id=\"pass-{k}\">no pass</span>")
            }
        }),
    );
    row(
        &mut h,
        "end",
        both(&|k, r| format!("<span id=\"end-{k}\">{}</span>", e(&r.end_reason))),
    );
    row(
        &mut h,
        "detail",
        both(&|k, r| match &r.detail {
            Some(d) => format!("<span id=\"detail-{k}\">{}</span>", e(d)),
            None => none.to_owned(),
        }),
    );
    row(&mut h, "ticks run", both(&|_, r| r.ticks.to_string()));
    row(
        &mut h,
        "failed at",
        both(&|k, r| match r.failed_at_tick {
            Some(t) => format!(
                "<span id=\"failed-{k}\" data-tick=\"{t}\">tick {t} ({} s)</span>",
                json_number(t as f64 / f64::from(tps.max(1)))
            ),
            None => "<span class=\"none\">never</span>".to_owned(),
        }),
    );
    let scored = meta.score.is_some() || runs.iter().any(|r| r.score.is_some());
    if scored {
        let (name, unit) = meta
            .score
            .as_ref()
            .map_or(("score", ""), |s| (s.name.as_str(), s.unit.as_str()));
        row(
            &mut h,
            &format!("score <span class=\"u\">{}</span>", e(name)),
            both(&|k, r| match r.score {
                Some(v) => format!("<span id=\"score-{k}\">{}</span>", value_with_unit(v, unit)),
                None => none.to_owned(),
            }),
        );
        row(
            &mut h,
            "scenario's min_score",
            both(&|k, r| match r.min_score {
                Some(v) => format!(
                    "<span id=\"min-score-{k}\">{}</span>",
                    value_with_unit(v, unit)
                ),
                None => none.to_owned(),
            }),
        );
    }
    row(
        &mut h,
        "final state",
        both(&|_, r| {
            if r.final_state.len() != n {
                return "<span class=\"none\">not given</span>".to_owned();
            }
            let parts: Vec<String> = meta
                .state
                .iter()
                .zip(&r.final_state)
                .map(|(v, x)| format!("{} = {}", e(&v.name), value_with_unit(*x, &v.unit)))
                .collect();
            format!("<span class=\"values\">{}</span>", parts.join("<br>"))
        }),
    );
    row(
        &mut h,
        "fingerprint",
        both(&|_, r| {
            format!(
                "<code class=\"fingerprint\">{}</code>{}",
                e(&r.fingerprint),
                badge(same_fp)
            )
        }),
    );
    row(
        &mut h,
        "fingerprint = SHA-256 of the embedded trajectory",
        both(&|_, r| {
            let computed = hex::encode(Sha256::digest(&r.trajectory));
            if computed == r.fingerprint {
                "<span class=\"ok\">yes (checked when this page was made)</span>".to_owned()
            } else {
                format!(
                    "<span class=\"bad\">NO: the embedded bytes hash to <code>{computed}</code></span>"
                )
            }
        }),
    );
    row(
        &mut h,
        "request SHA-256",
        both(&|_, r| {
            format!(
                "<code class=\"request-digest\">{}</code>",
                e(&r.request_sha256)
            )
        }),
    );
    row(
        &mut h,
        "result SHA-256",
        both(&|_, r| {
            format!(
                "<code class=\"result-digest\">{}</code>",
                e(&r.result_sha256)
            )
        }),
    );
    h.push_str("</table>");

    // Comparison.
    h.push_str("<h2>Comparison</h2><ul id=\"comparison\">");
    let _ = write!(
        h,
        "<li>Fingerprints of <b>{}</b> and <b>{}</b>: {}</li>",
        e(&input.accepted.label),
        e(&input.draft.label),
        badge(same_fp)
    );
    if let Some(repeat) = &input.accepted_repeat_fingerprint {
        let _ = write!(
            h,
            "<li id=\"repeat\">A repeated run of <b>{}</b>: <code class=\"fingerprint\">{}</code>{}</li>",
            e(&input.accepted.label),
            e(repeat),
            badge(*repeat == input.accepted.fingerprint)
        );
    }
    match div.record {
        Some(k) => {
            let _ = write!(
                h,
                "<li>The trajectories first differ at tick <b id=\"divergence\" data-tick=\"{k}\">{k}</b> (the first record whose state or action differs, or where one run ended).</li>"
            );
        }
        None => h.push_str(
            "<li>The trajectories are identical: <b id=\"divergence\" data-tick=\"none\">no divergence</b>.</li>",
        ),
    }
    match div.state {
        Some(k) => {
            let _ = write!(
                h,
                "<li>The states first differ at tick <b id=\"state-divergence\" data-tick=\"{k}\">{k}</b> (an action answered at tick k shows in the state of tick k+1).</li>"
            );
        }
        None => h.push_str(
            "<li>Every state is the same: <b id=\"state-divergence\" data-tick=\"none\">no divergence</b>.</li>",
        ),
    }
    for (run, dec) in runs.iter().zip(&decs) {
        if dec.stray != 0 || dec.records.len() as u64 != run.ticks {
            let _ = write!(
                h,
                "<li class=\"bad\">{}: the trajectory holds {} records of {} bytes (+{} stray bytes) but the verdict says {} ticks.</li>",
                e(&run.label),
                dec.records.len(),
                record_bytes(n, m),
                dec.stray,
                run.ticks
            );
        }
    }
    h.push_str("</ul>");

    // The simulator's variables, as its metadata declares them.
    h.push_str("<h2>Simulator</h2><table id=\"variables\"><tr><th>kind</th><th>name</th><th>unit</th><th>bounds</th></tr>");
    let var_row = |h: &mut String, kind: &str, name: &str, unit: &str, bounds: String| {
        let _ = write!(
            h,
            "<tr><td>{kind}</td><td><code>{}</code></td><td>{}</td><td>{bounds}</td></tr>",
            e(name),
            e(unit)
        );
    };
    for v in &meta.state {
        var_row(&mut h, "state", &v.name, &v.unit, String::new());
    }
    for v in &meta.action {
        let bounds = format!("{} to {}", json_number(v.min), json_number(v.max));
        var_row(&mut h, "action", &v.name, &v.unit, bounds);
    }
    for v in &meta.initial {
        var_row(
            &mut h,
            "scenario's initial value",
            &v.name,
            &v.unit,
            String::new(),
        );
    }
    if let Some(s) = &meta.score {
        var_row(
            &mut h,
            "score (higher is better)",
            &s.name,
            &s.unit,
            String::new(),
        );
    }
    h.push_str("</table>");

    // Sources.
    h.push_str("<h2>Controller sources</h2><div class=\"sources\">");
    for (k, run) in runs.iter().enumerate() {
        let _ = write!(
            h,
            "<div><h3><i class=\"sw sw{k}\"></i>{}</h3><pre><code id=\"source-{k}\">{}</code></pre></div>",
            e(&run.label),
            e(&run.controller_source)
        );
    }
    h.push_str("</div>");

    h.push_str(
        r#"<h2 id="not-claimed">What this page does not claim</h2>
<ul>
<li>It is evidence, not attestation: nothing on it is signed, and the page itself is unsigned. Anyone could have written these numbers; check them by re-running the trials and comparing fingerprints and digests.</li>
<li>The isolation tier is what the daemon's probe saw on the host when the run was made, not a property this page can verify.</li>
<li>The simulator's name, version, SHA-256 and metadata are what the runner reported; the page does not hold the module, and its description is the exam author's text. That the simulator models anything faithfully is the exam author's claim, not this page's.</li>
<li>Identical fingerprints prove that this simulator and this controller were deterministic on these runs only: not on other scenarios, hosts or inputs, and not that the controller is correct.</li>
<li>A fingerprint identifies the recorded states and actions; it does not prove that they obey the simulator's dynamics (that takes the simulator), nor which source produced them (the request digest covers the sources). The end, detail and score are the verdict's words, not recomputed here.</li>
<li>The replay draws the recorded states and the actions as the controller answered them (before the runner's clamp to the bounds); it simulates nothing and says nothing about timing.</li>
</ul>
"#,
    );

    let _ = write!(
        h,
        "<script type=\"application/json\" id=\"trajectories\">{data}</script>\n<script>{SCRIPT}</script>\n</body></html>\n"
    );
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escape_covers_the_five_characters() {
        assert_eq!(
            escape(r#"<a href="x">&'"#),
            "&lt;a href=&quot;x&quot;&gt;&amp;&#39;"
        );
    }

    #[test]
    fn divergence_finds_the_first_record_and_the_first_state() {
        let rec = |s: [f64; 4], a: f64| crate::trajectory::encode(&s, &[a]);
        let a: Vec<u8> = [
            rec([0.0, 0.0, 0.1, 0.0], 1.0),
            rec([0.1, 0.0, 0.1, 0.0], 1.0),
        ]
        .concat();
        let b: Vec<u8> = [
            rec([0.0, 0.0, 0.1, 0.0], 2.0),
            rec([0.2, 0.0, 0.1, 0.0], 1.0),
        ]
        .concat();
        let both = |record, state| Divergence { record, state };
        assert_eq!(divergence(&a, &b, 4, 1), both(Some(0), Some(1)));
        assert_eq!(divergence(&a, &a, 4, 1), both(None, None));
        assert_eq!(divergence(&a, &a[..40], 4, 1), both(Some(1), Some(1)));
        // The same bytes read as records of 2 states and 3 actions: 5 doubles still, but the
        // first difference (the action 1.0 vs 2.0) is now in the third action slot.
        assert_eq!(divergence(&a, &b, 2, 3), both(Some(0), Some(1)));
        // Records of one state and one action: 16 bytes, the third holds the first difference.
        assert_eq!(divergence(&a, &b, 1, 1), both(Some(2), Some(2)));
        assert_eq!(divergence(&a, &b, 0, 0), both(Some(0), Some(0)));
    }

    #[test]
    fn axis_steps_are_one_two_or_five_times_a_power_of_ten() {
        assert_eq!(nice_step(1.0, 4.0), 0.5);
        assert_eq!(nice_step(10.0, 4.0), 5.0);
        assert_eq!(nice_step(180.0, 6.0), 50.0);
        assert_eq!(nice_step(0.0, 4.0), 1.0);
        assert_eq!(axis_label(-0.0000000001, 0.1), "0");
        assert_eq!(axis_label(0.25, 0.05), "0.25");
        assert_eq!(axis_label(100.0, 20.0), "100");
        assert_eq!(axis_label(0.1 + 0.2 - 0.3, 0.1), "0");
        assert_eq!(axis_label(2e-5, 1e-5), "2.0e-5");
    }
}
