//! Invariants from ARCHITECTURE.md that a test can hold about the code's shape: source locations reach
//! MLIR; the macro crates' dependencies; the 600-line cap over the engines, the lowering, the Mosaic
//! model and the vector math; dependency directions (the vector math a leaf, melior only in the MLIR
//! writer and Mosaic-on-CPU, lower → mosaic ← serialize, the engines on `semantics/` and not on each
//! other); a kernel crate without MLIR; a new op row a compile error at each consumer column.

mod common;

#[test]
fn rust_source_locations_are_carried_into_mlir() {
    let call = common::matmul::build().expect("matmul builds");
    let text = call.mosaic_mlir_with_locations().expect("lowers");
    let src = include_str!("../examples/matmul.rs");
    // The tpu.matmul op is located at the `+` of `acc.load() + dot(..)` (the fused add) in the example.
    let line = src
        .lines()
        .position(|l| l.contains("acc.store(acc.load() + dot("))
        .expect("line")
        + 1;
    let matmul_line = text
        .lines()
        .find(|l| l.contains("\"tpu.matmul\""))
        .expect("a tpu.matmul op");
    let loc = resolve_loc(&text, matmul_line);
    assert!(
        loc.contains(&format!("examples/matmul.rs\":{line}:")),
        "tpu.matmul is not located at examples/matmul.rs:{line}: {loc}"
    );
    // The scf.if comes from the user's `if` keyword line.
    let if_line = src
        .lines()
        .position(|l| l.contains("if program_id(2) == 0"))
        .expect("if")
        + 1;
    assert!(
        text.contains(&format!("examples/matmul.rs\":{if_line}:")),
        "no location for line {if_line}"
    );
}

/// The location of an op line: inline `loc(...)` or an alias `loc(#locN)` resolved at the module's end.
fn resolve_loc(module: &str, op_line: &str) -> String {
    let loc = op_line
        .rsplit(" loc(")
        .next()
        .unwrap_or_default()
        .trim_end_matches(')');
    if let Some(alias) = loc.strip_prefix('#') {
        let def = format!("#{alias} = loc(");
        if let Some(l) = module.lines().find(|l| l.starts_with(&def)) {
            return l.to_string();
        }
    }
    loc.to_string()
}

/// The `[dependencies]` names of a manifest, in order.
fn dependency_names(manifest: &str) -> Vec<&str> {
    let deps = manifest
        .split("[dependencies]")
        .nth(1)
        .expect("[dependencies]");
    let deps = deps.split("\n[").next().unwrap_or_default();
    deps.lines()
        .filter_map(|l| l.split('=').next().map(str::trim))
        .filter(|n| !n.is_empty() && !n.starts_with('#'))
        .collect()
}

#[test]
fn kernel_macros_depends_only_on_syn_quote_proc_macro2() {
    let core = include_str!("../kernel-macros-core/Cargo.toml");
    assert_eq!(
        dependency_names(core),
        ["proc-macro2", "quote", "syn"],
        "kernel-macros-core must not grow dependencies (no melior)"
    );
    let entry = include_str!("../kernel-macros/Cargo.toml");
    assert_eq!(
        dependency_names(entry),
        ["kernel-macros-core", "proc-macro2"],
        "kernel-macros is the thin proc-macro entry into kernel-macros-core"
    );
}

/// The sources under `kernel-runtime/src/<folder>` (path relative to that folder, text).
fn runtime_sources(folder: &str) -> Vec<(String, String)> {
    sources(&std::path::Path::new("kernel-runtime/src").join(folder))
}

/// The Rust sources under `dir` (relative to the repository root): path relative to `dir`, text.
fn sources(dir: &std::path::Path) -> Vec<(String, String)> {
    fn walk(dir: &std::path::Path, root: &std::path::Path, out: &mut Vec<(String, String)>) {
        for e in std::fs::read_dir(dir).expect("runtime sources") {
            let p = e.expect("dir entry").path();
            if p.is_dir() {
                walk(&p, root, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                let rel = p.strip_prefix(root).expect("prefix").display().to_string();
                out.push((rel, std::fs::read_to_string(&p).expect("read")));
            }
        }
    }
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
    let mut out = Vec::new();
    walk(&root, &root, &mut out);
    out
}

/// The interpreter's sources (path relative to `kernel-runtime/src/interpret`, text).
fn interpreter_sources() -> Vec<(String, String)> {
    let out = runtime_sources("interpret");
    assert!(out.len() > 20, "found only {} interpreter files", out.len());
    out
}

/// Each of `files` (the sources of `folder`, as errors name it) is under 600 lines.
fn assert_files_under_600_lines(folder: &str, files: &[(String, String)]) {
    for (path, text) in files {
        let n = text.lines().count();
        assert!(
            n < 600,
            "{folder}/{path} has {n} lines: split it along a boundary"
        );
    }
}

/// A file holds one idea: the files of the interpreter, of Mosaic on CPU, of the lowering, of the
/// Mosaic model and its writers, and of the vector math stay under 600 lines.
#[test]
fn interpreter_files_stay_under_600_lines() {
    assert_files_under_600_lines("interpret", &interpreter_sources());
    let mosaic_cpu = runtime_sources("mosaic_cpu");
    assert!(
        mosaic_cpu.len() > 10,
        "found only {} mosaic_cpu files",
        mosaic_cpu.len()
    );
    assert_files_under_600_lines("mosaic_cpu", &mosaic_cpu);
    for folder in ["lower", "mosaic"] {
        let files = runtime_sources(folder);
        assert!(files.len() > 4, "found only {} {folder} files", files.len());
        assert_files_under_600_lines(folder, &files);
    }
    let math = sources(std::path::Path::new("kernel-math/src"));
    assert!(
        math.len() > 8,
        "found only {} kernel-math files",
        math.len()
    );
    assert_files_under_600_lines("kernel-math/src", &math);
}

/// The vector math is a leaf: it depends on nothing (the engines depend on it), and the IR's op table
/// names it through `kernel_runtime::math`, not through the interpreter.
#[test]
fn the_vector_math_depends_on_nothing_and_the_ir_not_on_the_interpreter() {
    let manifest = include_str!("../kernel-math/Cargo.toml");
    assert_eq!(
        dependency_names(manifest),
        Vec::<&str>::new(),
        "kernel-math must stay dependency-free"
    );
    for (path, text) in runtime_sources("ir") {
        assert!(
            !text.contains("crate::interpret"),
            "ir/{path} names the interpreter"
        );
    }
}

/// Loops are compiled twice only through `simd::multiversion!`; `#[target_feature]` appears only on the
/// explicit-intrinsic kernels (which are AVX2/AVX-512 code by construction).
#[test]
fn only_the_multiversion_macro_compiles_a_loop_twice() {
    let intrinsic_kernels = ["simd.rs", "dot_bf16.rs", "dot_bf16_order.rs", "dot_i8.rs"];
    for (path, text) in interpreter_sources() {
        if !intrinsic_kernels.contains(&path.as_str()) {
            assert!(
                !text.contains("#[target_feature"),
                "interpret/{path} enables target features itself: use `simd::multiversion!`"
            );
        }
    }
}

/// `cargo tree --prefix none` with `args`, run at the root, one package per line.
fn cargo_tree(args: &[&str]) -> String {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = std::process::Command::new(cargo)
        .arg("tree")
        .args(args)
        .args(["--prefix", "none"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("running cargo tree");
    assert!(
        out.status.success(),
        "cargo tree {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

/// `cargo tree` of `package` over normal and build dependencies (what its build compiles), one
/// package per line.
fn normal_build_tree(package: &str) -> String {
    cargo_tree(&["-e", "normal,build", "-p", package])
}

/// A cargo command at the root (`cargo build --examples`, `cargo test --test X`, as pytest runs them)
/// resolves every package's features as `cargo test --workspace` does, so it reuses that build. A
/// feature only one of the two selections saw (a dev-dependency's feature, a member missing from
/// `default-members`) rebuilt mlir-sys, every example and test binaries a second time, and filled
/// CI's disk.
#[test]
fn a_command_at_the_root_resolves_features_as_the_workspace_does() {
    let resolved = |selection: &[&str]| -> std::collections::BTreeSet<String> {
        let args = [&["-e", "normal,build,dev", "-f", "{p} [{f}]"], selection].concat();
        cargo_tree(&args)
            .lines()
            .map(|l| l.trim_end_matches(" (*)").to_owned())
            .filter(|l| !l.is_empty())
            .collect()
    };
    let (root, workspace) = (resolved(&[]), resolved(&["--workspace"]));
    assert_eq!(
        root.symmetric_difference(&workspace).collect::<Vec<_>>(),
        Vec::<&String>::new(),
        "packages resolved differently at the root and with --workspace"
    );
}

/// A kernel crate (the user crate, and tpu-kernel with default features) compiles no MLIR: LLVM/MLIR
/// is needed only for the `mlir` and `mosaic-cpu` features (`scripts/no_mlir_build.sh` builds the user
/// crate with the MLIR prefix pointing at an empty folder).
#[test]
fn a_kernel_crate_builds_no_melior_or_mlir_sys() {
    for package in ["tpu-kernel-user-crate", "tpu-kernel-examples", "tpu-kernel"] {
        let tree = normal_build_tree(package);
        assert!(
            tree.lines().any(|l| l.starts_with("kernel-runtime v")),
            "{package}: {tree}"
        );
        for l in tree.lines() {
            assert!(
                !(l.starts_with("melior") || l.starts_with("mlir-sys") || l.starts_with("tblgen")),
                "{package} builds `{l}` with default features:\n{tree}"
            );
        }
    }
}

/// Only the MLIR writer (`mosaic/mlir/`, feature `mlir`) and the Mosaic-on-CPU engine (`mosaic_cpu/`,
/// feature `mosaic-cpu`) name melior or mlir-sys; lowering builds the module as data and the writers
/// depend on nothing upstream of it: `lower → mosaic ← serialize`.
#[test]
fn melior_stays_in_the_mlir_writer_and_dependencies_run_one_way() {
    for (path, text) in runtime_sources("") {
        if path.starts_with("mosaic/mlir/") || path.starts_with("mosaic_cpu/") {
            continue;
        }
        for name in ["melior::", "mlir_sys::", "use melior", "use mlir_sys"] {
            assert!(!text.contains(name), "{path} names `{name}`");
        }
    }
    for (path, text) in runtime_sources("mosaic") {
        let path = format!("mosaic/{path}");
        for upstream in [
            "crate::ir",
            "crate::lower",
            "crate::serialize",
            "crate::interpret",
        ] {
            assert!(
                !text.contains(upstream),
                "{path} names `{upstream}`: the Mosaic model and its writers know nothing upstream"
            );
        }
    }
    for (path, text) in runtime_sources("lower") {
        let path = format!("lower/{path}");
        for writer in ["crate::serialize", "mosaic::bytecode", "mosaic::mlir"] {
            assert!(
                !text.contains(writer),
                "{path} names `{writer}`: lowering builds the model, never a writer's output"
            );
        }
    }
}

/// One Pallas-semantics core under both CPU engines: `semantics/` (host arrays, the block schedule,
/// the DMA model and the error vocabulary) names neither engine, and neither engine names the other —
/// a fault both can see has one message, built in `semantics/`.
#[test]
fn both_engines_share_the_semantics_core_and_not_each_other() {
    let core = runtime_sources("semantics");
    assert!(core.len() >= 5, "found only {} semantics files", core.len());
    assert_files_under_600_lines("semantics", &core);
    let named = |text: &str, module: &str| {
        text.contains(&format!("crate::{module}")) || text.contains(&format!("super::{module}"))
    };
    // Code, not docs: a doc comment may point a reader at the other engine.
    let code = |text: &str| -> String {
        text.lines()
            .filter(|l| !l.trim_start().starts_with("//"))
            .collect::<Vec<_>>()
            .join("\n")
    };
    for (path, text) in &core {
        for engine in ["interpret", "mosaic_cpu"] {
            assert!(
                !named(&code(text), engine),
                "semantics/{path} names `{engine}`: the core belongs to neither engine"
            );
        }
    }
    for (from, to) in [("interpret", "mosaic_cpu"), ("mosaic_cpu", "interpret")] {
        let files = runtime_sources(from);
        assert!(files.len() > 10, "found only {} {from} files", files.len());
        for (path, text) in files {
            assert!(
                !named(&code(&text), to),
                "{from}/{path} names `{to}`: the engines share `semantics/`, not each other"
            );
        }
    }
    // Each engine does use the core: the schedule and the DMA vocabulary.
    for (engine, item) in [
        ("interpret", "semantics::schedule"),
        ("interpret", "semantics::dma"),
        ("mosaic_cpu", "semantics::schedule"),
        ("mosaic_cpu", "semantics::dma"),
        ("mosaic_cpu", "semantics::refs"),
        ("interpret", "semantics::refs"),
    ] {
        assert!(
            runtime_sources(engine)
                .iter()
                .any(|(_, t)| t.contains(item)),
            "{engine} does not use `{item}`"
        );
    }
}

/// One definition per op: a row added to the op table (`kernel-ops`; the test-only feature
/// `__probe_new_row` adds `Tan`) is a compile error at each consumer's column until it says what the op
/// means there — the lowering's Mosaic op and the interpreter's meaning — and nowhere else (the traced
/// method `x.tan()` and the names are generated from the row). `cargo check` in its own target folder
/// (the outer `cargo test` holds this one's lock).
#[test]
fn a_new_op_row_is_a_compile_error_at_every_consumer() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = std::process::Command::new(cargo)
        .args([
            "check",
            "--quiet",
            "--message-format",
            "short",
            "-p",
            "kernel-runtime",
        ])
        .args(["--features", "kernel-ops/__probe_new_row"])
        .env("CARGO_TARGET_DIR", root.join("target/probe-new-row"))
        .current_dir(root)
        .output()
        .expect("running cargo check");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the probe row compiled:\n{stderr}");
    let mut places: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains(": error"))
        .filter_map(|l| l.split(':').next())
        .collect();
    places.sort();
    places.dedup();
    assert_eq!(
        places,
        [
            "kernel-runtime/src/interpret/ops.rs",
            "kernel-runtime/src/lower/rules/elementwise.rs",
        ],
        "the consumers a new row must reach:\n{stderr}"
    );
    for l in stderr.lines().filter(|l| l.contains(": error")) {
        assert!(
            l.contains("E0004") && l.contains("UnaryOp::Tan"),
            "not a missing-arm error for the new row: {l}\n{stderr}"
        );
    }
}
