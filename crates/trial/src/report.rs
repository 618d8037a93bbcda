//! The trial report: one static, self-contained HTML page that replays two recorded trials
//! (an accepted controller and a draft) from their trajectories, with charts, sources,
//! fingerprints, digests and what the page does not claim (docs/trials.md).
//!
//! The page loads nothing: inline CSS and JS, a Content-Security-Policy of `default-src 'none'`
//! that admits only the page's own script (by its SHA-256), and no physics in the browser: the
//! replay only reads the recorded states. Every string from the input is HTML-escaped; the
//! trajectories enter the script as JSON numbers only.

use std::fmt::Write as _;

use base64::Engine as _;
use sha2::{Digest as _, Sha256};

/// The cart-pole's trajectory record: four state values and the force.
const RECORD_BYTES: usize = 40;

/// One recorded run, as the report shows it.
#[derive(Debug, Clone)]
pub struct RunInput {
    /// A short name ("accepted", "draft").
    pub label: String,
    /// The controller's source (untrusted text; escaped on the page).
    pub controller_source: String,
    /// The trajectory file's bytes (40-byte records, docs/trials.md).
    pub trajectory: Vec<u8>,
    /// The verdict's fingerprint (lowercase hex SHA-256 of the trajectory).
    pub fingerprint: String,
    /// The verdict's `ticks`.
    pub ticks: u64,
    /// The verdict's `fell_at_tick`.
    pub fell_at_tick: Option<u64>,
    /// The verdict's `end_reason`.
    pub end_reason: String,
    /// The provider that ran it.
    pub provider: String,
    /// The isolation tier the result states.
    pub tier: String,
    /// SHA-256 of the request, as the client recomputed it.
    pub request_sha256: String,
    /// SHA-256 of the result, as the client recomputed it.
    pub result_sha256: String,
}

/// What the report shows.
#[derive(Debug, Clone)]
pub struct ReportInput {
    /// The page's heading.
    pub title: String,
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
    /// The first record (tick) whose 40 bytes differ, or where one trajectory ends before the
    /// other; None when the two are identical.
    pub record: Option<usize>,
    /// The first tick whose state (the first 32 bytes of the record) differs, or where one
    /// trajectory ends; None when every state is the same.
    pub state: Option<usize>,
}

/// Compares two trajectories record by record.
pub fn divergence(a: &[u8], b: &[u8]) -> Divergence {
    let ra: Vec<&[u8]> = a.chunks(RECORD_BYTES).collect();
    let rb: Vec<&[u8]> = b.chunks(RECORD_BYTES).collect();
    let first = |width: usize| -> Option<usize> {
        let common = ra.len().min(rb.len());
        (0..common)
            .find(|&k| ra[k][..width.min(ra[k].len())] != rb[k][..width.min(rb[k].len())])
            .or((ra.len() != rb.len()).then_some(common))
    };
    Divergence {
        record: first(RECORD_BYTES),
        state: first(32),
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

/// The trajectory as records of five doubles (a trailing partial record is dropped).
fn records(bytes: &[u8]) -> Vec<[f64; 5]> {
    bytes
        .chunks_exact(RECORD_BYTES)
        .map(|r| {
            std::array::from_fn(|i| f64::from_le_bytes(r[i * 8..i * 8 + 8].try_into().expect("8")))
        })
        .collect()
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

const ACCEPTED_COLOUR: &str = "#1f6fd1";
const DRAFT_COLOUR: &str = "#e0701b";
const CHART_W: f64 = 560.0;
const CHART_H: f64 = 190.0;

/// An inline SVG chart of one state component (index `i`) of both runs over ticks.
fn chart(
    id: &str,
    title: &str,
    runs: &[&[[f64; 5]]; 2],
    i: usize,
    range: f64,
    limit: f64,
    ticks: usize,
) -> String {
    let (l, r, t, b) = (44.0, 8.0, 22.0, 20.0);
    let (pw, ph) = (CHART_W - l - r, CHART_H - t - b);
    let xs = |k: usize| l + pw * k as f64 / (ticks.max(2) - 1) as f64;
    let ys = |v: f64| t + ph * (1.0 - (v.clamp(-range, range) + range) / (2.0 * range));
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg class="chart" id="{id}" viewBox="0 0 {CHART_W} {CHART_H}" width="{CHART_W}" height="{CHART_H}" role="img" aria-label="{title}">"#
    );
    let _ = write!(
        s,
        r##"<text x="{l}" y="14" class="ct">{title}</text><rect x="{l}" y="{t}" width="{pw}" height="{ph}" fill="#fbfbfb" stroke="#ccc"/>"##
    );
    for v in [limit, -limit] {
        let y = ys(v);
        let _ = write!(
            s,
            r##"<line x1="{l}" x2="{}" y1="{y:.2}" y2="{y:.2}" stroke="#c33" stroke-dasharray="4 3"/><text x="{}" y="{:.2}" class="ax">{v}</text>"##,
            l + pw,
            2,
            y + 4.0
        );
    }
    let y0 = ys(0.0);
    let _ = write!(
        s,
        r##"<line x1="{l}" x2="{}" y1="{y0:.2}" y2="{y0:.2}" stroke="#999"/><text x="{l}" y="{}" class="ax">0</text><text x="{}" y="{}" class="ax" text-anchor="end">{} ticks</text>"##,
        l + pw,
        CHART_H - 5.0,
        l + pw,
        CHART_H - 5.0,
        ticks
    );
    for (run, colour) in runs.iter().zip([ACCEPTED_COLOUR, DRAFT_COLOUR]) {
        let mut pts = String::new();
        for (k, rec) in run.iter().enumerate() {
            let _ = write!(pts, "{:.2},{:.2} ", xs(k), ys(rec[i]));
        }
        let _ = write!(
            s,
            r#"<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="{}"/>"#,
            pts.trim_end()
        );
    }
    let _ = write!(
        s,
        r##"<line class="cursor" x1="{l}" x2="{l}" y1="{t}" y2="{}" stroke="#222" data-left="{l}" data-width="{pw}"/></svg>"##,
        t + ph
    );
    s
}

const STYLE: &str = r###"
body{font:14px/1.4 system-ui,-apple-system,"Segoe UI",sans-serif;margin:12px 20px;color:#222;background:#fff}
h1{font-size:20px;margin:0 0 4px}h2{font-size:16px;margin:18px 0 6px}
.sub{color:#555;margin:0 0 8px}
.badge{display:inline-block;padding:0 7px;border-radius:9px;font-size:12px;font-weight:600;margin-left:6px}
.same{background:#d8f3dc;color:#1b5e20}.differs{background:#ffe0cc;color:#8a3b00}
.ok{color:#1b5e20}.bad{color:#b00020}
#replay{display:block;border:1px solid #ccc;background:#fff}
.controls{display:flex;gap:10px;align-items:center;margin:6px 0}
.controls input[type=range]{flex:1}
.charts{display:flex;gap:12px;flex-wrap:wrap}
.chart text.ct{font-size:13px;font-weight:600}.chart text.ax{font-size:10px;fill:#666}
.legend span{margin-right:14px}.sw{display:inline-block;width:12px;height:3px;vertical-align:middle;margin-right:4px}
table{border-collapse:collapse;margin:4px 0}td,th{border:1px solid #ddd;padding:3px 8px;text-align:left;vertical-align:top}
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
  try {
    var data = JSON.parse(document.getElementById("trajectories").textContent);
    var runs = data.runs;
    var labels = [document.getElementById("label-0").textContent, document.getElementById("label-1").textContent];
    var colours = [data.colours[0], data.colours[1]];
    var last = 0;
    for (var r = 0; r < runs.length; r++) { last = Math.max(last, runs[r].records.length - 1); }
    var canvas = document.getElementById("replay");
    var ctx = canvas.getContext("2d");
    var slider = document.getElementById("slider");
    var button = document.getElementById("play");
    var out = document.getElementById("tick");
    var cursors = document.querySelectorAll(".cursor");
    slider.max = String(last);
    var tick = 0, timer = null;
    var PX = 130, LIMIT_X = 2.4, POLE = 1.0, LANE = canvas.height / 2;

    function lane(i, k) {
      var run = runs[i], top = i * LANE, cx0 = canvas.width / 2, ground = top + LANE - 24;
      ctx.fillStyle = "#222"; ctx.font = "bold 14px sans-serif"; ctx.textAlign = "left";
      ctx.fillText(labels[i], 12, top + 20);
      ctx.strokeStyle = "#888"; ctx.lineWidth = 2;
      ctx.beginPath(); ctx.moveTo(cx0 - (LIMIT_X + 0.2) * PX, ground + 12); ctx.lineTo(cx0 + (LIMIT_X + 0.2) * PX, ground + 12); ctx.stroke();
      ctx.strokeStyle = "#c33"; ctx.lineWidth = 1;
      [-LIMIT_X, LIMIT_X].forEach(function (lx) {
        ctx.beginPath(); ctx.moveTo(cx0 + lx * PX, ground - 30); ctx.lineTo(cx0 + lx * PX, ground + 18); ctx.stroke();
      });
      if (run.records.length === 0) { ctx.fillText("no records", 12, top + 40); return; }
      var shown = Math.min(k, run.records.length - 1), rec = run.records[shown];
      var x = rec[0], theta = rec[2], force = rec[4];
      var cx = cx0 + x * PX;
      ctx.fillStyle = colours[i];
      ctx.fillRect(cx - 30, ground - 10, 60, 22);
      ctx.fillStyle = "#333";
      ctx.beginPath(); ctx.arc(cx - 18, ground + 14, 5, 0, 7); ctx.arc(cx + 18, ground + 14, 5, 0, 7); ctx.fill();
      var px = cx + Math.sin(theta) * POLE * PX, py = ground - 10 - Math.cos(theta) * POLE * PX;
      ctx.strokeStyle = k > shown && run.fell ? "#b00020" : "#5a3e1b"; ctx.lineWidth = 6; ctx.lineCap = "round";
      ctx.beginPath(); ctx.moveTo(cx, ground - 10); ctx.lineTo(px, py); ctx.stroke();
      ctx.fillStyle = "#222"; ctx.font = "12px monospace"; ctx.textAlign = "left";
      var status = k > shown ? (run.fell ? "fell after tick " + run.ticks : "ended after tick " + run.ticks) : "tick " + shown;
      ctx.fillText(status + "  x=" + x.toFixed(3) + " m  theta=" + theta.toFixed(4) + " rad  F=" + force.toFixed(3) + " N", 12, top + 38);
    }

    function draw() {
      ctx.clearRect(0, 0, canvas.width, canvas.height);
      ctx.strokeStyle = "#ddd"; ctx.beginPath(); ctx.moveTo(0, LANE); ctx.lineTo(canvas.width, LANE); ctx.stroke();
      for (var i = 0; i < runs.length; i++) { lane(i, tick); }
      slider.value = String(tick);
      out.textContent = String(tick);
      out.setAttribute("data-tick", String(tick));
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
        tick += 1; draw();
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
    let runs = [&input.accepted, &input.draft];
    let recs: Vec<Vec<[f64; 5]>> = runs.iter().map(|r| records(&r.trajectory)).collect();
    let div = divergence(&input.accepted.trajectory, &input.draft.trajectory);
    let max_ticks = recs.iter().map(Vec::len).max().unwrap_or(0);

    // The data the script reads: numbers and fixed strings only.
    let mut data = String::from("{\"runs\":[");
    for (n, (run, rs)) in runs.iter().zip(&recs).enumerate() {
        if n > 0 {
            data.push(',');
        }
        let _ = write!(
            data,
            "{{\"ticks\":{},\"fell\":{},\"records\":[",
            run.ticks,
            run.fell_at_tick.is_some()
        );
        for (k, rec) in rs.iter().enumerate() {
            if k > 0 {
                data.push(',');
            }
            data.push('[');
            for (j, v) in rec.iter().enumerate() {
                if j > 0 {
                    data.push(',');
                }
                data.push_str(&json_number(*v));
            }
            data.push(']');
        }
        data.push_str("]}");
    }
    let _ = write!(
        data,
        "],\"colours\":[\"{ACCEPTED_COLOUR}\",\"{DRAFT_COLOUR}\"],\"title\":{}}}",
        serde_json::to_string("plimsoll trial report").expect("a string serialises")
    );

    let script_hash =
        base64::engine::general_purpose::STANDARD.encode(Sha256::digest(SCRIPT.as_bytes()));
    let title = escape(&input.title);
    let e = |s: &str| escape(s);

    let mut h = String::with_capacity(300_000 + data.len() * 2);
    let _ = write!(
        h,
        r#"<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; script-src 'sha256-{script_hash}'; style-src 'unsafe-inline'; img-src data:">
<meta name="referrer" content="no-referrer">
<title>{title}</title><style>{STYLE}</style></head>
<body data-errors="">
<h1 id="report-title">{title}</h1>
<p class="sub">Replay of two recorded trials from their trajectories: nothing is simulated in this page.</p>
"#
    );

    // Replay.
    let _ = write!(
        h,
        r#"<canvas id="replay" width="1160" height="380">The replay needs a canvas.</canvas>
<div class="controls"><button id="play" type="button">Pause</button>
<label for="slider">tick</label><input id="slider" type="range" min="0" max="{}" value="0" step="1">
<output id="tick" data-tick="0">0</output></div>
<div class="legend"><span><i class="sw" style="background:{ACCEPTED_COLOUR}"></i><b id="label-0">{}</b></span><span><i class="sw" style="background:{DRAFT_COLOUR}"></i><b id="label-1">{}</b></span></div>
<div class="charts">{}{}</div>
"#,
        max_ticks.saturating_sub(1),
        e(&input.accepted.label),
        e(&input.draft.label),
        chart(
            "chart-theta",
            "pole angle theta (rad)",
            &[&recs[0], &recs[1]],
            2,
            0.25,
            0.2094,
            max_ticks
        ),
        chart(
            "chart-x",
            "cart position x (m)",
            &[&recs[0], &recs[1]],
            0,
            2.6,
            2.4,
            max_ticks
        ),
    );

    // Runs.
    h.push_str("<h2>Runs</h2><table id=\"runs\"><tr><th></th>");
    for run in runs {
        let _ = write!(h, "<th>{}</th>", e(&run.label));
    }
    h.push_str("</tr>");
    let row = |h: &mut String, name: &str, cells: [String; 2]| {
        let _ = write!(
            h,
            "<tr><th>{name}</th><td>{}</td><td>{}</td></tr>",
            cells[0], cells[1]
        );
    };
    let both = |f: &dyn Fn(&RunInput) -> String| [f(runs[0]), f(runs[1])];
    let same_fp = input.accepted.fingerprint == input.draft.fingerprint;
    row(
        &mut h,
        "provider",
        both(&|r| format!("<span class=\"provider\">{}</span>", e(&r.provider))),
    );
    row(
        &mut h,
        "isolation tier",
        both(&|r| format!("<span class=\"tier\">{}</span>", e(&r.tier))),
    );
    row(&mut h, "end", both(&|r| e(&r.end_reason)));
    row(&mut h, "ticks", both(&|r| r.ticks.to_string()));
    row(
        &mut h,
        "fell at tick",
        both(&|r| {
            r.fell_at_tick
                .map_or_else(|| "never".to_owned(), |k| k.to_string())
        }),
    );
    row(
        &mut h,
        "fingerprint",
        both(&|r| {
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
        both(&|r| {
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
        both(&|r| {
            format!(
                "<code class=\"request-digest\">{}</code>",
                e(&r.request_sha256)
            )
        }),
    );
    row(
        &mut h,
        "result SHA-256",
        both(&|r| {
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
                "<li>The trajectories first differ at tick <b id=\"divergence\" data-tick=\"{k}\">{k}</b> (record {k}: the first record whose state or force differs, or where one run ended).</li>"
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
                "<li>The states first differ at tick <b id=\"state-divergence\" data-tick=\"{k}\">{k}</b> (a force answered at tick k shows in the state of tick k+1).</li>"
            );
        }
        None => h.push_str(
            "<li>Every state is the same: <b id=\"state-divergence\" data-tick=\"none\">no divergence</b>.</li>",
        ),
    }
    for (run, rs) in runs.iter().zip(&recs) {
        let extra = run.trajectory.len() % RECORD_BYTES;
        if extra != 0 || rs.len() as u64 != run.ticks {
            let _ = write!(
                h,
                "<li class=\"bad\">{}: the trajectory holds {} records (+{extra} stray bytes) but the verdict says {} ticks.</li>",
                e(&run.label),
                rs.len(),
                run.ticks
            );
        }
    }
    h.push_str("</ul>");

    // Sources.
    h.push_str("<h2>Controller sources</h2><div class=\"sources\">");
    for (n, run) in runs.iter().enumerate() {
        let _ = write!(
            h,
            "<div><h3>{}</h3><pre><code id=\"source-{n}\">{}</code></pre></div>",
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
<li>Identical fingerprints prove that this simulator and this controller were deterministic on these runs only: not on other scenarios, hosts or inputs, and not that the controller is correct.</li>
<li>A fingerprint identifies the recorded states and forces; it does not prove that they obey the dynamics (that takes the simulator), nor which source produced them (the request digest covers the sources).</li>
<li>The replay draws the recorded states; it simulates nothing and says nothing about timing.</li>
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
        let rec = |v: [f64; 5]| -> Vec<u8> { v.iter().flat_map(|f| f.to_le_bytes()).collect() };
        let a: Vec<u8> = [
            rec([0.0, 0.0, 0.1, 0.0, 1.0]),
            rec([0.1, 0.0, 0.1, 0.0, 1.0]),
        ]
        .concat();
        let b: Vec<u8> = [
            rec([0.0, 0.0, 0.1, 0.0, 2.0]),
            rec([0.2, 0.0, 0.1, 0.0, 1.0]),
        ]
        .concat();
        assert_eq!(
            divergence(&a, &b),
            Divergence {
                record: Some(0),
                state: Some(1)
            }
        );
        assert_eq!(
            divergence(&a, &a),
            Divergence {
                record: None,
                state: None
            }
        );
        assert_eq!(
            divergence(&a, &a[..40]),
            Divergence {
                record: Some(1),
                state: Some(1)
            }
        );
    }
}
