//! The model alone, in process: feeding it 1,000,000 observations over
//! 50,000 workloads (what start-up does after reading the projection), then
//! answering. Shows what the model costs next to the serving benchmark's
//! per-call figures.
//!
//! Run with `cargo bench -p runyard-allocator --bench model`.
#![allow(clippy::unwrap_used, clippy::print_stdout)] // a benchmark's main

use std::time::Instant;

use runyard_allocator::model::{Model, Observation, Params, Workload};

const GB: u64 = 1_000_000_000;
const MB: u64 = 1_000_000;

fn resident_bytes() -> u64 {
    runyard_bench::procfs::memory(std::process::id())
        .unwrap_or_default()
        .rss_kib
        * 1024
}

fn main() {
    let workloads: Vec<Workload> = (0..50_000)
        .map(|i| {
            [
                ("package", format!("pkg-{}", i / 5)),
                ("version", format!("1.{}", i % 5)),
                (
                    "variants",
                    if i % 2 == 0 { "+shared~pic" } else { "~shared" }.to_owned(),
                ),
                ("compiler", "gcc".to_owned()),
                ("compiler_version", "12.3.0".to_owned()),
                ("arch", "x86_64_v3".to_owned()),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect()
        })
        .collect();
    let keys: Vec<String> = workloads
        .iter()
        .map(|w| runyard_store::workload::key(w.iter().map(|(k, v)| (k.as_str(), v.as_str()))))
        .collect();
    let observation = |i: usize| Observation {
        at: 1_790_000_000.0 + i as f64,
        peak_memory_bytes: GB + (i as u64 * 2_654_435_761 % 1000) * MB,
        memory_limit_bytes: Some(4 * GB),
        memory_request_bytes: None,
        cpu_seconds: 600.0,
        wall_seconds: 300.0,
        oom_killed: false,
        protected: true,
        job: None,
    };

    let before = resident_bytes();
    let started = Instant::now();
    let mut model = Model::new(Params::default());
    for i in 0..1_000_000usize {
        model.observe_key(&keys[i * 7919 % keys.len()], observation(i));
    }
    let load = started.elapsed();
    let held = resident_bytes().saturating_sub(before);

    let asks = 200_000;
    let mut sum = 0u64;
    let mut per_pass = Vec::new();
    for _ in 0..2 {
        // The first pass fits each window; the second reuses the fits.
        let started = Instant::now();
        for i in 0..asks {
            let w = &workloads[i * 31 % workloads.len()];
            sum = sum.wrapping_add(model.recommend(w).memory_limit_bytes);
        }
        per_pass.push(started.elapsed().as_secs_f64() * 1e6 / asks as f64);
    }
    let (w, s) = model.stats();
    println!("| measure | value |");
    println!("|---|---|");
    println!("| observe 1,000,000 samples by key ({w} workloads, {s} held) | {load:.2?} |");
    println!("| model memory | {} MiB |", held / (1 << 20));
    println!(
        "| recommend, first ask of each workload | {:.2} µs |",
        per_pass[0]
    );
    println!(
        "| recommend, asked again | {:.2} µs (checksum {sum}) |",
        per_pass[1]
    );
}
