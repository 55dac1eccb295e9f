//! The export layer from Rust: the library registry (requests, static parameters, errors naming the
//! argument and the Rust line, the build cache), Pallas's batching rule checked against running the
//! kernel once per batch element, and the interpreter on borrowed arrays against the owned path.

mod common;

use common::{matmul, rmsnorm, softmax};
use serde_json::json;
use tpu_kernel::__private::export::{HostExport, Library, Request};
use tpu_kernel::prelude::*;
use tpu_kernel::runtime::interpret::{
    interpret_into, ArrayView, ArrayViewMut, HostArray, HostData, InterpretOptions,
};
use tpu_kernel::ErrorKind;

fn library() -> Library {
    Library::new(
        "test",
        vec![
            matmul::__tpu_kernel_export_matmul(),
            matmul::__tpu_kernel_export_matmul_dx(),
            rmsnorm::__tpu_kernel_export_rmsnorm(),
            softmax::__tpu_kernel_export_softmax(),
        ],
    )
}

fn request(v: serde_json::Value) -> Request {
    Request::from_json(&v).expect("request")
}

fn err_of(lib: &Library, v: serde_json::Value) -> tpu_kernel::KernelError {
    match Request::from_json(&v).and_then(|r| lib.build(&r)) {
        Ok(_) => panic!("expected an error for {v}"),
        Err(e) => e,
    }
}

#[test]
fn defaults_fill_in_and_a_second_request_hits_the_cache() {
    let lib = library();
    let req = json!({"kernel": "softmax", "inputs": [{"shape": [64, 256], "dtype": "f32"}]});
    let a = lib.build(&request(req.clone())).expect("build");
    assert_eq!(a.params.to_json(), json!({"block_rows": 8}));
    assert_eq!(a.call.ir().grid, vec![8]);
    let b = lib.build(&request(req)).expect("build");
    assert!(std::sync::Arc::ptr_eq(&a, &b), "same signature, same build");
    // `block_rows=8` spelled out is the same signature; another value is another kernel.
    let c = lib
        .build(&request(json!({"kernel": "softmax", "inputs": [{"shape": [64, 256], "dtype": "f32"}], "params": {"block_rows": 8}})))
        .expect("build");
    assert!(std::sync::Arc::ptr_eq(&a, &c));
    let d = lib
        .build(&request(json!({"kernel": "softmax", "inputs": [{"shape": [64, 256], "dtype": "f32"}], "params": {"block_rows": 16}})))
        .expect("build");
    assert_eq!(d.call.ir().grid, vec![4]);
    assert_eq!(
        lib.stats.builds.load(std::sync::atomic::Ordering::Relaxed),
        2
    );
}

/// Rust is the one canonicalizer: `eps=1` and `eps=1.0` (an int and a float from Python) are one
/// kernel, and `canonical` answers the parameters a build is keyed on without building.
#[test]
fn two_spellings_of_a_static_parameter_are_one_kernel() {
    let lib = library();
    let req = |eps: serde_json::Value| {
        request(
            json!({"kernel": "rmsnorm", "inputs": [{"shape": [64, 256], "dtype": "bf16"}, {"shape": [1, 256], "dtype": "f32"}], "params": {"eps": eps}}),
        )
    };
    let a = lib.build(&req(json!(1))).expect("build");
    let b = lib.build(&req(json!(1.0))).expect("build");
    assert!(
        std::sync::Arc::ptr_eq(&a, &b),
        "eps=1 and eps=1.0 built twice"
    );
    assert_eq!(a.params.to_json()["eps"], json!(1.0));
    let answer = |eps: serde_json::Value| {
        lib.dispatch(
            "canonical",
            &json!({"kernel": "rmsnorm", "params": {"eps": eps}}).to_string(),
        )
    };
    assert_eq!(answer(json!(1)), answer(json!(1.0)));
    assert_eq!(answer(json!(1))["params"], a.params.to_json());
    assert_eq!(
        lib.stats.builds.load(std::sync::atomic::Ordering::Relaxed),
        1
    );
}

#[test]
fn request_mistakes_are_errors_naming_what_is_wrong() {
    let lib = library();
    let x = json!({"shape": [256, 256], "dtype": "bf16"});
    let e = err_of(&lib, json!({"kernel": "nope", "inputs": []}));
    assert!(
        e.message.contains("has no kernel `nope`") && e.message.contains("matmul"),
        "{e}"
    );
    let e = err_of(&lib, json!({"kernel": "matmul", "inputs": [x]}));
    assert!(e.message.contains("takes 2 arrays (x, y), got 1"), "{e}");
    let e = err_of(
        &lib,
        json!({"kernel": "matmul", "inputs": [x, x], "params": {"blok": [1, 2, 3]}}),
    );
    assert_eq!(e.argument.as_deref(), Some("blok"));
    assert!(
        e.message
            .contains("its static parameters are: block: (usize, usize, usize)"),
        "{e}"
    );
    let e = err_of(
        &lib,
        json!({"kernel": "matmul", "inputs": [x, x], "params": {"block": [128, 128]}}),
    );
    assert_eq!(e.kind, ErrorKind::Signature);
    assert!(e.message.contains("must be (usize, usize, usize)"), "{e}");
    let e = err_of(
        &lib,
        json!({"kernel": "matmul", "inputs": [x, {"shape": [256, 256], "dtype": "f64"}]}),
    );
    assert!(e.message.contains("unsupported dtype `f64`"), "{e}");
    // Shape rules of the launch fn are located at its lines.
    let e = err_of(
        &lib,
        json!({"kernel": "matmul", "inputs": [x, {"shape": [128, 256], "dtype": "bf16"}]}),
    );
    assert_eq!(e.kind, ErrorKind::Shape);
    assert!(e.message.contains("inner dimensions"), "{e}");
    let loc = e.location.expect("located").to_string();
    assert!(
        loc.starts_with("tests/../examples/matmul.rs") || loc.starts_with("examples/matmul.rs"),
        "{loc}"
    );
    let e = err_of(
        &lib,
        json!({"kernel": "matmul", "inputs": [{"shape": [200, 256], "dtype": "bf16"}, x]}),
    );
    assert_eq!(e.kind, ErrorKind::Grid);
    assert!(
        e.message.contains("not a multiple of the block size 128"),
        "{e}"
    );
    let e = err_of(
        &lib,
        json!({"kernel": "matmul", "inputs": [{"shape": [256], "dtype": "bf16"}, x]}),
    );
    assert!(e.message.contains("expected a rank-2 array"), "{e}");
}

fn slice_leading(a: &HostArray, b: usize) -> HostArray {
    let inner: Vec<usize> = a.shape()[1..].to_vec();
    let n: usize = inner.iter().product();
    let data = match a.data() {
        HostData::BF16(v) => HostData::BF16(v[b * n..(b + 1) * n].to_vec()),
        HostData::F32(v) => HostData::F32(v[b * n..(b + 1) * n].to_vec()),
        _ => unreachable!("test dtypes"),
    };
    HostArray::new(inner, data).expect("slice")
}

/// A batched kernel computes, for each batch element, exactly the bits of the unbatched kernel.
#[test]
fn batching_matches_one_run_per_batch_element() {
    let lib = library();
    // matmul over a batch of x with one shared y (an unbatched operand ignores the batch axis).
    let batched = lib
        .build(&request(json!({
            "kernel": "matmul",
            "inputs": [{"shape": [3, 256, 128], "dtype": "bf16"}, {"shape": [128, 256], "dtype": "bf16"}],
            "batch": [[3, [true, false]]],
        })))
        .expect("batched build");
    let k = batched.call.ir();
    assert_eq!(k.grid, vec![3, 2, 2, 1]);
    assert_eq!(k.dimension_semantics[0], Parallel);
    let single = lib
        .build(&request(json!({
            "kernel": "matmul",
            "inputs": [{"shape": [256, 128], "dtype": "bf16"}, {"shape": [128, 256], "dtype": "bf16"}],
        })))
        .expect("build");
    let x = HostArray::random([3, 256, 128], BF16, 1).unwrap();
    let y = HostArray::random([128, 256], BF16, 2).unwrap();
    let out = batched
        .call
        .interpret(&[x.clone(), y.clone()])
        .expect("run");
    assert_eq!(out[0].shape(), &[3, 256, 256]);
    for b in 0..3 {
        let one = single
            .call
            .interpret(&[slice_leading(&x, b), y.clone()])
            .expect("run");
        assert_eq!(slice_leading(&out[0], b), one[0], "batch element {b}");
    }
    // Nested: two levels, the inner batching only w... rmsnorm with x batched at both levels and w
    // batched at the outer level only.
    let nested = lib
        .build(&request(json!({
            "kernel": "rmsnorm",
            "inputs": [{"shape": [2, 3, 32, 256], "dtype": "bf16"}, {"shape": [2, 1, 256], "dtype": "f32"}],
            "batch": [[2, [true, true]], [3, [true, false]]],
        })))
        .expect("nested build");
    assert_eq!(nested.call.ir().grid, vec![2, 3, 2]);
    let single = lib
        .build(&request(json!({
            "kernel": "rmsnorm",
            "inputs": [{"shape": [32, 256], "dtype": "bf16"}, {"shape": [1, 256], "dtype": "f32"}],
        })))
        .expect("build");
    let x = HostArray::random([2, 3, 32, 256], BF16, 3).unwrap();
    let w = HostArray::random([2, 1, 256], F32, 4).unwrap();
    let out = nested.call.interpret(&[x.clone(), w.clone()]).expect("run");
    for a in 0..2 {
        let xa = slice_leading(&x, a);
        let wa = slice_leading(&w, a);
        let oa = slice_leading(&out[0], a);
        for b in 0..3 {
            let one = single
                .call
                .interpret(&[slice_leading(&xa, b), wa.clone()])
                .expect("run");
            assert_eq!(slice_leading(&oa, b), one[0], "batch element ({a}, {b})");
        }
    }
    // The batched kernel still lowers to Mosaic that verifies (squeezed leading block dims).
    let text = batched.call.mosaic_mlir().expect("mosaic");
    assert!(
        text.contains("iteration_bounds = array<i64: 3, 2, 2, 1>"),
        "{text}"
    );
}

#[test]
fn a_batch_level_must_match_the_arrays() {
    let lib = library();
    let e = err_of(
        &lib,
        json!({"kernel": "softmax", "inputs": [{"shape": [4, 64, 256], "dtype": "f32"}], "batch": [[3, [true]]]}),
    );
    assert!(
        e.message.contains("does not lead with the batch size 3"),
        "{e}"
    );
}

/// XLA's buffers: the interpreter reads inputs in place and writes outputs in place, with the same
/// bits as the owned path — also when an input is not aligned for its element type (then copied).
#[test]
fn borrowed_arrays_give_the_bits_of_owned_ones() {
    let call = softmax::softmax(ArrayType::new([64, 256], F32), 8).expect("build");
    let x = HostArray::random([64, 256], F32, 7).unwrap();
    let want = call.interpret(std::slice::from_ref(&x)).expect("run");
    let xs: Vec<f32> = x.as_slice::<f32>().expect("f32").to_vec();
    let shape = [64usize, 256];
    for misalign in [0usize, 1] {
        // Bytes of x at offset `misalign` of a byte buffer.
        let mut bytes = vec![0u8; xs.len() * 4 + 8];
        let raw: Vec<u8> = xs.iter().flat_map(|v| v.to_ne_bytes()).collect();
        let base = bytes.as_ptr() as usize;
        let start = (4 - base % 4) % 4 + misalign;
        bytes[start..start + raw.len()].copy_from_slice(&raw);
        let mut out = vec![0f32; xs.len()];
        // SAFETY: `bytes[start..]` holds 64·256 f32 values (aligned or not, as the test wants) and
        // `out` has room for as many; both outlive the call and nothing else touches them.
        let (input, mut output) = unsafe {
            (
                ArrayView::from_raw(&shape, F32, bytes.as_ptr().add(start)),
                ArrayViewMut::from_raw(&shape, F32, out.as_mut_ptr().cast()),
            )
        };
        interpret_into(
            call.ir(),
            &[input],
            std::slice::from_mut(&mut output),
            &InterpretOptions::default(),
        )
        .expect("run");
        let want: Vec<u32> = want[0]
            .as_slice::<f32>()
            .expect("f32")
            .iter()
            .map(|v| v.to_bits())
            .collect();
        let got: Vec<u32> = out.iter().map(|v| v.to_bits()).collect();
        assert_eq!(got, want, "misaligned by {misalign}");
    }
    // Wrong output shapes are errors, not writes out of bounds.
    let mut small = vec![0f32; 16];
    let bad_shape = [4usize, 4];
    // SAFETY: both pointers are live for the views' use below, `xs` and `small` outlive them, and the
    // views claim no more elements than the buffers hold (`small` has 16, exactly [4, 4]).
    let (input, mut output) = unsafe {
        (
            ArrayView::from_raw(&shape, F32, xs.as_ptr().cast()),
            ArrayViewMut::from_raw(&bad_shape, F32, small.as_mut_ptr().cast()),
        )
    };
    let e = interpret_into(
        call.ir(),
        &[input],
        std::slice::from_mut(&mut output),
        &InterpretOptions::default(),
    )
    .expect_err("shape mismatch");
    assert!(e.message.contains("output array"), "{e}");
}

#[test]
fn the_library_description_lists_kernels_params_and_grads() {
    let lib = library();
    let d: serde_json::Value =
        serde_json::from_str(lib.description().to_str().expect("utf8")).expect("json");
    assert_eq!(d["abi_version"], json!(5));
    assert_eq!(d["ffi_target"], json!("tpu_kernel_test"));
    // The dtype table, one row per DType (Python's dtype map).
    let names: Vec<&str> = d["dtypes"]
        .as_array()
        .expect("dtypes")
        .iter()
        .map(|r| r["name"].as_str().expect("name"))
        .collect();
    let table: Vec<&str> = tpu_kernel::DType::ALL.iter().map(|d| d.name()).collect();
    assert_eq!(names, table);
    assert_eq!(
        &names[..7],
        ["f32", "bf16", "i32", "i8", "u8", "u32", "bool"]
    );
    let mm = &d["kernels"][0];
    assert_eq!(mm["name"], json!("matmul"));
    assert_eq!(mm["inputs"], json!(["x", "y"]));
    assert_eq!(
        mm["params"],
        json!([{"name": "block", "type": "(usize, usize, usize)", "default": [128, 128, 128]}])
    );
    assert_eq!(
        mm["grad"][0],
        json!({"inputs": ["x"], "kernel": "matmul_dx", "args": ["g", "y"], "params": {"block": "block"}})
    );
    let rms = &d["kernels"][2];
    assert_eq!(
        rms["params"][0],
        json!({"name": "eps", "type": "f32", "default": 1e-6})
    );
    assert_eq!(rms["grad"][0]["inputs"], json!(["x", "w"]));
    assert_eq!(d["kernels"][3]["grad"], json!(null));
}

/// A gradient rule is checked against the library when it is made: the backward kernel must be
/// exported, take as many arrays as the rule passes, and have the parameters it sets.
#[test]
fn gradient_rules_must_fit_the_library() {
    let complete = vec![
        matmul::__tpu_kernel_export_matmul(),
        matmul::__tpu_kernel_export_matmul_dx(),
        matmul::__tpu_kernel_export_matmul_dw(),
        rmsnorm::__tpu_kernel_export_rmsnorm(),
        rmsnorm::__tpu_kernel_export_rmsnorm_bwd(),
    ];
    assert_eq!(
        tpu_kernel::__private::export::problems(&complete),
        Vec::<String>::new()
    );
    // matmul without its matmul_dw: the library says so (and the Python loader refuses it).
    let lib = Library::new(
        "partial",
        vec![
            matmul::__tpu_kernel_export_matmul(),
            matmul::__tpu_kernel_export_matmul_dx(),
        ],
    );
    let d: serde_json::Value =
        serde_json::from_str(lib.description().to_str().expect("utf8")).expect("json");
    let problems = d["problems"].as_array().expect("problems");
    assert_eq!(problems.len(), 1, "{problems:?}");
    let p = problems[0].as_str().expect("text");
    assert!(
        p.contains("calls `matmul_dw`, which this library does not export"),
        "{p}"
    );
    assert!(
        p.contains("examples/matmul.rs"),
        "located at the export: {p}"
    );
}

/// `grouped_matmul`'s metadata as the examples library exports it (a host function, what
/// `tpu_kernel.examples.group_metadata` calls): the reference tables for sizes that fit the kernel,
/// and an error naming the mistake for sizes that do not.
#[test]
fn group_metadata_is_a_host_function_of_the_examples() {
    use common::grouped_matmul::group_metadata;
    let lib = Library::new("test", vec![])
        .with_host(vec![HostExport::new("group_metadata", group_metadata)]);
    let call = |args: serde_json::Value| {
        lib.dispatch(
            "host",
            &json!({"function": "group_metadata", "args": args}).to_string(),
        )
    };
    // 4 groups over 512 rows in 128-row tiles, one empty: 4 tiles + 2 boundary revisits, padded to 7.
    assert_eq!(
        call(json!([[100, 0, 290, 122], 512, 128])),
        json!({"ok": true, "result": [[0, 100, 100, 390, 512], [0, 2, 2, 2, 2, 3, 3], [0, 0, 1, 2, 3, 3, 3]]})
    );
    for (sizes, m, tm) in [
        (vec![0, 0, 0], 0, 128),
        (vec![256], 256, 128),
        (vec![7, 0, 1, 0, 56], 64, 8),
    ] {
        let (o, g, t) = group_metadata(sizes.clone(), m, tm).expect("valid sizes");
        assert_eq!((o, g, t), tpu_kernel::reference::group_metadata(&sizes, tm));
    }
    for (args, message) in [
        (json!([[], 0, 128]), "at least one group"),
        (
            json!([[100, 28], 128, 0]),
            "not a multiple of the row tile tm = 0",
        ),
        (json!([[100, 28], 100, 8]), "m = 100 is not a multiple"),
        (
            json!([[100, -1, 29], 128, 128]),
            "group 1 has a negative size -1",
        ),
        (json!([[100, 27], 128, 128]), "sum to 127, not m = 128"),
        (
            json!([[2147483647, 1], 2147483648u64, 128]),
            "do not fit the i32 metadata",
        ),
        (
            json!([[1.5], 128, 128]),
            "must be Vec<i32>: element 0: expected an integer",
        ),
    ] {
        let a = call(args.clone());
        let text = a["error"]["text"].as_str().unwrap_or_default();
        assert!(text.contains(message), "{args}: {a}");
    }
    let a = call(json!([[100, -1, 29], 128, 128]));
    let loc = a["error"]["location"]
        .as_str()
        .expect("located")
        .to_string();
    assert!(loc.contains("examples/grouped_matmul.rs"), "{loc}");
}

mod aliasing {
    use tpu_kernel::prelude::*;

    #[tpu_kernel]
    fn scale_kernel(x: Ref<f32>, o: RefMut<f32>) {
        o.store(x.load() * 2.0f32);
    }

    fn launch(x: ArrayType, alias: bool) -> Result<PallasCall, KernelError> {
        let spec = || BlockSpec::new([8, 128], |[i]| (i, 0));
        let call = pallas_call(scale_kernel)
            .grid([x.blocks(0, 8)?])
            .input(x.clone(), spec())
            .output(x, spec());
        if alias {
            call.input_output_aliases([(0, 0)]).build()
        } else {
            call.build()
        }
    }

    /// Declared and aliased.
    #[export(mutates(x))]
    pub fn writes(x: ArrayType) -> Result<PallasCall, KernelError> {
        launch(x, true)
    }

    /// Aliased, not declared.
    #[export]
    pub fn writes_silently(x: ArrayType) -> Result<PallasCall, KernelError> {
        launch(x, true)
    }

    /// Declared, not aliased.
    #[export(mutates(x))]
    pub fn claims_to_write(x: ArrayType) -> Result<PallasCall, KernelError> {
        launch(x, false)
    }
}

/// `#[export(mutates(x))]` (what torch ops declare mutated) must be the launch's
/// `input_output_aliases`, checked when the kernel is built; the description lists it.
#[test]
fn mutates_is_held_to_the_launchs_aliases() {
    let lib = Library::new(
        "aliasing",
        vec![
            aliasing::__tpu_kernel_export_writes(),
            aliasing::__tpu_kernel_export_writes_silently(),
            aliasing::__tpu_kernel_export_claims_to_write(),
        ],
    );
    let req = |k: &str| json!({"kernel": k, "inputs": [{"shape": [16, 128], "dtype": "f32"}]});
    assert!(lib.build(&request(req("writes"))).is_ok());
    let e = err_of(&lib, req("writes_silently"));
    assert_eq!(e.kind, ErrorKind::Signature, "{e}");
    assert!(e.message.contains("write `#[export(mutates(x))]`"), "{e}");
    let e = err_of(&lib, req("claims_to_write"));
    assert!(
        e.message
            .contains("declares `mutates(x)` but its launch aliases no output"),
        "{e}"
    );
    let d: serde_json::Value =
        serde_json::from_str(lib.description().to_str().expect("utf8")).expect("json");
    let mutates = |k: &str| {
        d["kernels"]
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["name"] == k)
            .unwrap()["mutates"]
            .clone()
    };
    assert_eq!(mutates("writes"), json!(["x"]));
    assert_eq!(mutates("writes_silently"), json!([]));
}
