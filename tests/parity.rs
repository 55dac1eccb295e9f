//! Structural parity with the Mosaic that JAX Pallas emits for the same kernels (tests/data/pallas/):
//! same kernel signature types, same kernel func attributes, same transform (index-map) functions, and the
//! same compute ops. Constants, dead loads, `extui`/`cmpi` pairs and scalar broadcasts may differ.

mod common;

use std::collections::BTreeMap;

/// The text of function `@name` (from its `func.func` line to the closing `  }`).
fn func_text<'a>(module: &'a str, name: &str) -> &'a str {
    let start = module
        .find(&format!("func.func @{name}("))
        .unwrap_or_else(|| panic!("no func @{name}"));
    let rest = &module[start..];
    let end = rest.find("\n  }").map(|e| e + 4).unwrap_or(rest.len());
    &rest[..end]
}

/// Split `a = x, b = [y, z]` at top-level commas.
fn split_top(s: &str) -> Vec<String> {
    let (mut depth, mut cur, mut out) = (0i32, String::new(), Vec::new());
    for c in s.chars() {
        match c {
            '[' | '{' | '<' | '(' => depth += 1,
            ']' | '}' | '>' | ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(cur.trim().to_string());
                cur.clear();
                continue;
            }
            _ => {}
        }
        cur.push(c);
    }
    if !cur.trim().is_empty() {
        out.push(cur.trim().to_string());
    }
    out
}

/// The bracketed text following `open` at `start` (balanced).
fn balanced(s: &str, start: usize) -> &str {
    let bytes = s.as_bytes();
    let (open, close) = (bytes[start], if bytes[start] == b'(' { b')' } else { b'}' });
    let mut depth = 0;
    for (i, &b) in bytes.iter().enumerate().skip(start) {
        if b == open {
            depth += 1;
        } else if b == close {
            depth -= 1;
            if depth == 0 {
                return &s[start + 1..i];
            }
        }
    }
    panic!("unbalanced text")
}

struct FuncSig {
    arg_types: Vec<String>,
    attributes: BTreeMap<String, String>,
}

fn signature(func: &str) -> FuncSig {
    let header = func.lines().next().unwrap_or_default();
    let args = balanced(header, header.find('(').unwrap());
    let arg_types = split_top(args)
        .iter()
        .map(|a| a.split_once(": ").map(|x| x.1).unwrap_or(a).to_string())
        .collect();
    let mut attributes = BTreeMap::new();
    if let Some(at) = header.find(" attributes {") {
        for kv in split_top(balanced(header, at + " attributes ".len())) {
            let (k, v) = kv.split_once(" = ").unwrap_or((&kv, ""));
            attributes.insert(k.to_string(), v.to_string());
        }
    }
    FuncSig {
        arg_types,
        attributes,
    }
}

/// What a transform function returns: each result as `%argN` or the integer constant it is.
fn transform_results(func: &str) -> (String, Vec<String>) {
    let header = func.lines().next().unwrap_or_default();
    let sig = header
        .split_once('(')
        .map(|x| x.1)
        .unwrap_or_default()
        .trim_end_matches(" {")
        .to_string();
    let mut consts = BTreeMap::new();
    let mut ret = Vec::new();
    for line in func.lines().skip(1) {
        let l = line.trim();
        if let Some((name, rhs)) = l.split_once(" = arith.constant ") {
            consts.insert(
                name.to_string(),
                rhs.split(" : ").next().unwrap_or_default().to_string(),
            );
        } else if let Some(r) = l.strip_prefix("return ") {
            let vals = r.split(" : ").next().unwrap_or_default();
            ret = vals
                .split(", ")
                .map(|v| consts.get(v).cloned().unwrap_or(v.to_string()))
                .collect();
        }
    }
    (sig, ret)
}

/// Ops that carry the computation; counted in both modules.
fn is_compute_op(name: &str) -> bool {
    name.starts_with("math.")
        || name.starts_with("scf.") && name != "scf.yield"
        || [
            "tpu.matmul",
            "tpu.transpose",
            "tpu.iota",
            "tpu.vector_store",
            "tpu.assume_multiple",
            "vector.multi_reduction",
            "arith.select",
            "arith.extf",
            "arith.truncf",
            "arith.sitofp",
            "arith.fptosi",
            "arith.cmpf",
        ]
        .contains(&name)
}

/// Multiset of compute ops (with the reduction kind for multi_reduction, predicate for compares).
fn compute_ops(func: &str) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for line in func.lines().skip(1) {
        let l = line.trim();
        let stmt = l.split_once(" = ").map(|x| x.1).unwrap_or(l);
        let name = stmt
            .split(['(', ' '])
            .next()
            .unwrap_or_default()
            .trim_matches('"');
        if !is_compute_op(name) {
            continue;
        }
        let key = match name {
            "vector.multi_reduction" => format!(
                "{name} {}",
                stmt.split_whitespace().nth(1).unwrap_or_default()
            ),
            _ => name.to_string(),
        };
        *out.entry(key).or_insert(0) += 1;
    }
    // `arith.cmpi` with a real predicate (not Pallas's `ne` of `pl.when`) is compute too.
    for line in func.lines() {
        if let Some(pred) = line
            .split("arith.cmpi ")
            .nth(1)
            .and_then(|r| r.split(',').next())
        {
            if pred != "ne" {
                *out.entry(format!("arith.cmpi {pred}")).or_insert(0) += 1;
            }
        }
    }
    out
}

fn kernel_name(module: &str) -> String {
    let at = module.find("module @").expect("module header") + "module @".len();
    module[at..]
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string()
}

fn reference(name: &str) -> String {
    let path = format!(
        "{}/tests/data/pallas/{name}.mlir",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn check_parity(name: &str) {
    compare(name, &common::mosaic(name), &reference(name));
}

fn compare(name: &str, ours: &str, theirs: &str) {
    let kernel = kernel_name(theirs);
    assert_eq!(kernel_name(ours), kernel, "{name}: module / kernel name");
    assert!(
        ours.contains("stable_mosaic.version = 15 : i64"),
        "{name}: stable_mosaic.version"
    );

    let (fo, ft) = (func_text(ours, &kernel), func_text(theirs, &kernel));
    let (so, st) = (signature(fo), signature(ft));
    assert_eq!(so.arg_types, st.arg_types, "{name}: kernel signature types");
    assert_eq!(
        so.attributes, st.attributes,
        "{name}: kernel func attributes"
    );
    assert_eq!(compute_ops(fo), compute_ops(ft), "{name}: compute ops");

    let n_transforms = theirs.matches("func.func @transform_").count();
    assert_eq!(
        ours.matches("func.func @transform_").count(),
        n_transforms,
        "{name}: number of transform functions"
    );
    // Pallas numbers them by operand position (an ANY operand keeps its number): same names here.
    let names: Vec<&str> = theirs
        .split("func.func @")
        .skip(1)
        .filter_map(|s| s.split('(').next())
        .filter(|n| n.starts_with("transform_"))
        .collect();
    for t in names {
        assert_eq!(
            transform_results(func_text(ours, t)),
            transform_results(func_text(theirs, t)),
            "{name}: @{t}"
        );
    }
}

macro_rules! parity_tests {
    ($($name:ident),*) => {$(
        #[test]
        fn $name() {
            check_parity(stringify!($name));
        }
    )*};
}
parity_tests!(
    add,
    matmul,
    softmax,
    rmsnorm,
    causal_mask,
    fori_rowsum,
    transpose,
    colsum,
    gather_prefetch,
    dma_double,
    inplace_scale
);

#[test]
fn compute_op_extraction_sees_pallas_ops() {
    // Guard the comparator itself: it must find the ops that matter in Pallas's text.
    let path = format!(
        "{}/tests/data/pallas/matmul.mlir",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(path).unwrap();
    let ops = compute_ops(func_text(&text, "matmul_kernel"));
    assert_eq!(ops.get("tpu.matmul"), Some(&1));
    assert_eq!(ops.get("scf.if"), Some(&2));
    assert_eq!(ops.get("arith.truncf"), Some(&1));
    assert_eq!(ops.get("arith.cmpi eq"), Some(&2));
}

#[test]
fn comparator_rejects_structural_differences() {
    // Each mutation of a correct module must be caught.
    let ours = common::mosaic("causal_mask");
    let theirs = reference("causal_mask");
    let mutations = [
        ("arith.cmpi sge", "arith.cmpi sgt"),     // different compute
        ("array<i64: 4, 4>", "array<i64: 2, 8>"), // iteration bounds
        ("return %arg1, %arg0", "return %arg0, %arg1"), // index map (only in transform_1)
        (
            "memref<128x128xf32, #tpu.memory_space<vmem>>",
            "memref<128x256xf32, #tpu.memory_space<vmem>>",
        ),
    ];
    let mut caught = 0;
    for (from, to) in mutations {
        let bad = ours.replacen(from, to, 1);
        if bad == ours {
            continue;
        }
        let r = std::panic::catch_unwind(|| compare("causal_mask", &bad, &theirs));
        assert!(r.is_err(), "mutation `{from}` -> `{to}` was not detected");
        caught += 1;
    }
    assert!(caught >= 3, "only {caught} mutations applied");
}

// ---------------------------------------------------------------------------------------------- dot

mod dot_preferred {
    use tpu_kernel::prelude::*;

    /// `jnp.dot(x, y, preferred_element_type=jnp.float32)`.
    #[tpu_kernel]
    pub fn dot_bf16_f32_kernel(x: Ref<bf16>, y: Ref<bf16>, o: RefMut<f32>) {
        o.store(dot(x.load(), y.load()));
    }

    /// `jnp.dot(x, y, preferred_element_type=jnp.float32).astype(jnp.bfloat16)`.
    #[tpu_kernel]
    pub fn dot_bf16_bf16_kernel(x: Ref<bf16>, y: Ref<bf16>, o: RefMut<bf16>) {
        o.store(dot(x.load(), y.load()).cast::<bf16>());
    }

    /// The launch of `tests/data/pallas/README.md`: bf16 `x: [256, 256]` in row blocks, whole `y`.
    pub fn mosaic<O: tpu_kernel::dtype::Element>(
        kernel: impl tpu_kernel::launch::KernelFn<(Ref<bf16>, Ref<bf16>, RefMut<O>)>,
    ) -> String {
        pallas_call(kernel)
            .grid([2])
            .input(
                ArrayType::new([256, 256], BF16),
                BlockSpec::new([128, 256], |[i]| (i, 0)),
            )
            .input(
                ArrayType::new([256, 128], BF16),
                BlockSpec::new([256, 128], |[_]| (0, 0)),
            )
            .output(
                ArrayType::new([256, 128], O::DTYPE),
                BlockSpec::new([128, 128], |[i]| (i, 0)),
            )
            .build()
            .expect("builds")
            .mosaic_mlir()
            .expect("lowers")
    }
}

/// The `tpu.matmul` line without its SSA names: operand and result types, attributes.
fn matmul_line(module: &str) -> String {
    let line = module
        .lines()
        .find(|l| l.contains("tpu.matmul"))
        .unwrap_or_else(|| panic!("no tpu.matmul in {module}"));
    // Ours is printed in generic form (`: (a, b, c) -> d`), Pallas's in custom form (`: a, b, c -> d`).
    let attrs = &line[line.find('{').expect("attributes")..];
    attrs.replace(" : (", " : ").replace(") -> ", " -> ")
}

/// Pallas's `preferred_element_type=jnp.float32` is our `dot` (bf16 × bf16 accumulating into a zero
/// f32 `tpu.matmul`), and its `.astype(jnp.bfloat16)` our `.cast::<bf16>()` (`arith.truncf`).
#[test]
fn dot_preferred_element_type_matches_pallas() {
    for (name, ours) in [
        (
            "dot_bf16_f32",
            dot_preferred::mosaic(dot_preferred::dot_bf16_f32_kernel),
        ),
        (
            "dot_bf16_bf16",
            dot_preferred::mosaic(dot_preferred::dot_bf16_bf16_kernel),
        ),
    ] {
        let theirs = reference(name);
        compare(name, &ours, &theirs);
        assert_eq!(matmul_line(&ours), matmul_line(&theirs), "{name}");
    }
}
