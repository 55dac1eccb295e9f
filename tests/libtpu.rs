//! Generations in CI through libtpu from Rust (issue 25, items 1 and 4; no Python here): every example,
//! built for v5e, v6e and tpu7x, compiles with libtpu (`kernel_runtime::libtpu`, worker processes of
//! `tpu-kernel-libtpu-worker`) for that generation's topology, with LLO ops and scheduled bundles at or
//! under its Pallas twin's. The twins' programs are data (`tests/data/pallas_twins/<example>.<gen>.mlir`,
//! written by `scripts/pallas_twins.py`; `python/tests/test_libtpu.py` holds them current), compiled
//! here beside ours by the same libtpu.
//!
//! libtpu is found as `kernel_runtime::libtpu::find_library` says (the repo's `.venv`, made by
//! `scripts/setup.sh --python`, or `TPU_LIBRARY_PATH`); without it these tests fail, loudly.

mod common;

use std::path::PathBuf;
use tpu_kernel::runtime::libtpu::{Compiled, Compiler, Job};
use tpu_kernel::{CustomCall, Target};

const GENERATIONS: [Target; 3] = [Target::V5e, Target::V6e, Target::Tpu7x];

fn compiler(workers: usize) -> Compiler {
    Compiler::new_with_worker(
        workers,
        vec![env!("CARGO_BIN_EXE_tpu-kernel-libtpu-worker").into()],
    )
    .unwrap_or_else(|e| panic!("{e}"))
}

fn twin(name: &str, g: Target) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/pallas_twins")
        .join(format!("{name}.{}.mlir", g.name()));
    std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (the Pallas twin's program: write it with `.venv/bin/python scripts/pallas_twins.py {name}`)",
            path.display()
        )
    })
}

#[test]
fn every_example_at_or_under_its_pallas_twin_on_every_generation() {
    let mut keys = Vec::new();
    let mut jobs = Vec::new();
    for (name, build) in common::EXAMPLES {
        for g in GENERATIONS {
            let call = g
                .scope(build)
                .unwrap_or_else(|e| panic!("{name} for {g}: {e}"));
            let ours = CustomCall::new(call.ir())
                .stablehlo()
                .unwrap_or_else(|e| panic!("{name} for {g}: {e}"));
            jobs.push(Job::new(ours, g.name()));
            jobs.push(Job::new(twin(name, g), g.name()));
            keys.push((*name, g));
        }
    }
    let c = compiler(2);
    let start = std::time::Instant::now();
    let results = c.compile_all(&jobs, &|done, total| {
        if done % 22 == 0 || done == total {
            eprintln!("libtpu: {done}/{total} compiled");
        }
    });
    let wall = start.elapsed().as_secs_f64();
    let results: Vec<Compiled> = results
        .into_iter()
        .map(|r| r.unwrap_or_else(|e| panic!("{e}")))
        .collect();
    println!(
        "{} compiles in {wall:.1} s on {} workers ({:.2} compiles/s)",
        results.len(),
        c.workers(),
        results.len() as f64 / wall
    );
    println!(
        "{:<24} {:<6} {:>8} {:>8} {:>6}  {:>8} {:>8} {:>6}",
        "kernel", "gen", "LLO", "Pallas", "ratio", "bundles", "Pallas", "ratio"
    );
    let mut worse = Vec::new();
    for ((name, g), pair) in keys.iter().zip(results.chunks(2)) {
        let (ours, theirs) = (&pair[0], &pair[1]);
        assert!(ours.ok, "{name} on {g}: {}", ours.summary());
        assert!(
            theirs.ok,
            "{name}'s Pallas twin on {g}: {}",
            theirs.summary()
        );
        assert_eq!(ours.topology, Target::info(*g).topology, "{name}");
        let counts = |c: &Compiled, who: &str| match (c.llo_total(), c.bundles) {
            (Some(l), Some(b)) => (l, b),
            _ => panic!("{name} on {g}, {who}: no LLO or bundle count: {c:?}"),
        };
        let (ol, ob) = counts(ours, "ours");
        let (tl, tb) = counts(theirs, "the Pallas twin");
        println!(
            "{name:<24} {:<6} {ol:>8} {tl:>8} {:>6.3}  {ob:>8} {tb:>8} {:>6.3}",
            g.name(),
            ol as f64 / tl as f64,
            ob as f64 / tb as f64
        );
        if ol > tl || ob > tb {
            worse.push(format!(
                "{name} on {g}: LLO ops {ol} vs Pallas {tl}, bundles {ob} vs Pallas {tb}"
            ));
        }
    }
    assert!(
        worse.is_empty(),
        "above the Pallas twin:\n{}",
        worse.join("\n")
    );
}

#[test]
fn rejections_are_verdicts_and_the_pool_keeps_working() {
    let c = compiler(1);
    let bad = c
        .compile("module { func.func @main() { nonsense.op } }", "v6e")
        .unwrap();
    assert!(!bad.ok && !bad.aborted, "{bad:?}");
    assert!(
        bad.error.as_deref().unwrap_or("").contains("nonsense"),
        "{bad:?}"
    );
    let refused = c.compile("module {}", "v9z:1x1").unwrap_err();
    assert!(refused.to_string().contains("v9z:1x1"), "{refused}");
    let call = common::EXAMPLES[0].1().unwrap();
    let ok = c
        .compile(&CustomCall::new(call.ir()).stablehlo().unwrap(), "v5e")
        .unwrap();
    assert!(
        ok.ok && ok.llo_total().unwrap() > 0 && ok.bundles.unwrap() > 0,
        "{ok:?}"
    );
    assert_eq!(ok.topology, "v5e:1x1");
}

#[test]
fn a_missing_worker_program_is_an_error_naming_it() {
    let c = Compiler::new_with_worker(1, vec!["/nonexistent/tpu-kernel-worker".into()]).unwrap();
    let e = c.compile("module {}", "v5e").unwrap_err().to_string();
    assert!(e.contains("/nonexistent/tpu-kernel-worker"), "{e}");
}
