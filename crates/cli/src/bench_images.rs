//! `plimsoll bench --images A,B`: what an image costs a run at crun, measured side by side in
//! one run: warm starts (each image kept warm by a pool of its own) and cold starts of a
//! trivial Python snippet in each image, interleaved so the machine's noise falls on all
//! alike; then a session in the last image, its first cell importing pandas and the next
//! cells using it. Prints medians and p90s in milliseconds.

use std::time::{Duration, Instant};

use anyhow::{anyhow, bail};
use plimsoll_client::{RunOptions, new_request_id};
use plimsoll_engine::{Engine, SessionCallKind, Settings};
use plimsoll_wire::{Language, PROTOCOL, SessionOpenRequest, Start};

use crate::local::embedded_engine;
use crate::{EXIT_OK, Failure};

/// Runs the image bench.
pub fn bench_images(
    settings: &Settings,
    images: &[String],
    runs: u32,
    warmup: u32,
) -> Result<u8, Failure> {
    if images.is_empty() {
        return Err(Failure::usage(anyhow!(
            "--images needs at least one image name"
        )));
    }
    let dir = tempfile::Builder::new()
        .prefix("plimsoll-bench-images-")
        .tempdir()
        .map_err(|e| Failure::failed(anyhow!(e)))?;
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o711),
    )
    .map_err(|e| Failure::failed(anyhow!(e)))?;
    let engine_for = |warm: bool| -> Result<Engine, Failure> {
        let mut s = settings.clone();
        s.providers = Some(vec!["crun".to_owned()]);
        s.state_dir = Some(dir.path().join(if warm { "warm" } else { "cold" }));
        s.sandbox_uid_base = Some(if warm { 3_900_000 } else { 3_950_000 });
        s.pools = Some(
            [(
                "crun".to_owned(),
                plimsoll_engine::settings::PoolsOfProvider {
                    javascript: None,
                    python: warm.then(|| plimsoll_engine::settings::PoolValues {
                        min_idle: Some(1),
                        max_members: Some(2),
                        max_age_secs: None,
                        images: Some(images.to_vec()),
                        shrink_after_secs: None,
                    }),
                },
            )]
            .into_iter()
            .collect(),
        );
        let e = embedded_engine(&s)?;
        if warm {
            e.start_pools();
        }
        Ok(e)
    };
    eprintln!("plimsoll bench --images: probing crun, making pools for {images:?}");
    let warm = engine_for(true)?;
    let cold = engine_for(false)?;
    let mut samples: Vec<(String, Vec<f64>, u32)> = Vec::new();
    for image in images {
        for start in ["warm", "cold"] {
            samples.push((format!("{start} crun python {image}"), Vec::new(), 0));
        }
    }
    for round in 0..(warmup + runs) {
        for (i, image) in images.iter().enumerate() {
            for (j, engine) in [&warm, &cold].into_iter().enumerate() {
                if j == 0 {
                    wait_for_members(engine).map_err(Failure::failed)?;
                }
                let (ms, warm_start) = one_run(engine, image).map_err(Failure::failed)?;
                if round >= warmup {
                    let s = &mut samples[i * 2 + j];
                    s.1.push(ms);
                    s.2 += u32::from(warm_start);
                }
            }
        }
    }
    println!("case                                   median ms    p90 ms   warm/runs");
    for (label, mut ms, warm_count) in samples {
        ms.sort_by(f64::total_cmp);
        let (median, p90) = crate::bench::median_p90(&ms).unwrap_or((f64::NAN, f64::NAN));
        println!(
            "{label:<38} {median:>9.1} {p90:>9.1}   {warm_count}/{}",
            ms.len()
        );
    }
    warm.stop_pools();
    drop(warm);
    burst(settings, &dir, &images[0], runs.max(40)).map_err(Failure::failed)?;
    let last = images.last().expect("one image at least");
    let (import_ms, cells) = session_cells(&cold, last, runs).map_err(Failure::failed)?;
    let mut cells = cells;
    cells.sort_by(f64::total_cmp);
    let (median, p90) = crate::bench::median_p90(&cells).unwrap_or((f64::NAN, f64::NAN));
    println!(
        "session crun {last}: first cell `import pandas` {import_ms:.1} ms; then a cell using it: median {median:.1} ms, p90 {p90:.1} ms ({} cells)",
        cells.len()
    );
    Ok(EXIT_OK)
}

/// A client sending runs back to back, 50 ms apart (`runs` of them), to a pool of
/// `min_idle = 1, max_members = 4` that grows with demand and to the same pool held at
/// `min_idle` (`shrink_after_secs = 0`: it shrinks back at once, as pools did before they
/// grew), twice each, alternating: how many runs found a warm member.
fn burst(
    settings: &Settings,
    dir: &tempfile::TempDir,
    image: &str,
    runs: u32,
) -> anyhow::Result<()> {
    let engine = |grow: bool, n: u32| -> anyhow::Result<Engine> {
        let mut s = settings.clone();
        s.providers = Some(vec!["crun".to_owned()]);
        s.state_dir = Some(dir.path().join(format!("burst-{grow}-{n}")));
        s.sandbox_uid_base = Some(if grow { 3_960_000 } else { 3_970_000 });
        s.pools = Some(
            [(
                "crun".to_owned(),
                plimsoll_engine::settings::PoolsOfProvider {
                    javascript: None,
                    python: Some(plimsoll_engine::settings::PoolValues {
                        min_idle: Some(1),
                        max_members: Some(4),
                        max_age_secs: None,
                        images: Some(vec![image.to_owned()]),
                        shrink_after_secs: Some(if grow { 30 } else { 0 }),
                    }),
                },
            )]
            .into_iter()
            .collect(),
        );
        let e = embedded_engine(&s).map_err(|f| f.error)?;
        e.start_pools();
        Ok(e)
    };
    println!("burst: {runs} runs 50 ms apart at crun ({image}), pool min_idle 1, max_members 4");
    for n in 0..2 {
        for grow in [false, true] {
            let e = engine(grow, n)?;
            wait_for_members(&e)?;
            let mut warm = 0;
            for _ in 0..runs {
                warm += u32::from(one_run(&e, image)?.1);
                std::thread::sleep(Duration::from_millis(50));
            }
            println!(
                "  {}: {warm}/{runs} warm",
                if grow {
                    "grows with demand"
                } else {
                    "held at min_idle"
                }
            );
            e.stop_pools();
        }
    }
    Ok(())
}

/// Waits, untimed, until every pool has an idle member.
fn wait_for_members(engine: &Engine) -> anyhow::Result<()> {
    let start = Instant::now();
    while engine.pools_idle().iter().any(|(_, _, n)| *n == 0) {
        if start.elapsed() > Duration::from_secs(120) {
            bail!(
                "the pools did not fill in 120 s: {:?}",
                engine.pool_counts()
            );
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(())
}

/// One trivial snippet in `image` at crun: its wall-clock milliseconds through the engine,
/// and whether it started warm.
fn one_run(engine: &Engine, image: &str) -> anyhow::Result<(f64, bool)> {
    let request = RunOptions::snippet(Language::Python, "print(1)")
        .provider("crun")
        .image(image)
        .into_request(new_request_id());
    let t = Instant::now();
    let r = engine.run("bench", &request).map_err(|e| anyhow!(e))?;
    let ms = t.elapsed().as_secs_f64() * 1000.0;
    if r.result.stdout.as_slice() != b"1\n" {
        bail!("{image}: stdout {:?}", r.result.stdout.to_string_lossy());
    }
    Ok((ms, r.result.start == Some(Start::Warm)))
}

/// A session at crun in `image`: the first cell imports pandas (timed), then `cells` cells use
/// it (each timed).
fn session_cells(engine: &Engine, image: &str, cells: u32) -> anyhow::Result<(f64, Vec<f64>)> {
    let open = SessionOpenRequest {
        protocol: PROTOCOL,
        request_id: new_request_id(),
        language: Language::Python,
        minimum_isolation: None,
        provider: Some("crun".into()),
        grant: None,
        limits: None,
        idle_timeout_ms: None,
        max_lifetime_ms: None,
        image: Some(image.to_owned()),
    };
    let info = engine
        .open_session("bench", &open)
        .map_err(|e| anyhow!(e))?;
    let cell = |code: &str| -> anyhow::Result<f64> {
        let req = RunOptions::snippet(Language::Python, code).into_request(new_request_id());
        let t = Instant::now();
        let r = engine
            .session_call(
                "bench",
                &info.session_id,
                &req,
                SessionCallKind::Cell { restart: false },
                &mut |_| {},
            )
            .map_err(|e| anyhow!(e))?;
        if r.result.exit_code != Some(0) {
            bail!("cell failed: {:?}", r.result.stderr.to_string_lossy());
        }
        Ok(t.elapsed().as_secs_f64() * 1000.0)
    };
    let import = cell("import pandas as pd")?;
    let mut times = Vec::new();
    for _ in 0..cells.max(1) {
        times.push(cell("print(pd.DataFrame({'a': range(100)}).a.sum())")?);
    }
    let _ = engine.close_session("bench", &info.session_id, None);
    Ok((import, times))
}
