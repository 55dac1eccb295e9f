//! The registry's answers that need no kernel: static parameters made canonical by Rust (the one
//! canonicalizer every caller keys on) and the method table of `dispatch`.

use super::*;

/// A kernel whose launch is never reached: these tests stop at its parameters.
fn norm() -> KernelExport {
    KernelExport {
        name: "norm",
        doc: "",
        location: SourceLoc::caller(),
        inputs: &["x"],
        params: vec![
            ParamSpec::new::<f32>("eps", Some(1e-6)),
            ParamSpec::new::<(usize, usize)>("block", None),
        ],
        fwd: None,
        grad: None,
        mutates: &[],
        launch: |_, _| Err(kerr!(Unsupported, "not built in these tests")),
    }
}

fn ask(lib: &Library, method: &str, request: Value) -> Value {
    lib.dispatch(method, &request.to_string())
}

#[test]
fn canonical_params_are_one_form_per_value() {
    let lib = Library::new("t", vec![norm()]);
    let canonical = |params: Value| {
        ask(
            &lib,
            "canonical",
            json!({"kernel": "norm", "params": params}),
        )
    };
    let one = canonical(json!({"eps": 1.0, "block": [8, 128]}));
    assert_eq!(
        one,
        json!({"ok": true, "params": {"eps": 1.0, "block": [8, 128]}})
    );
    // `eps=1` (an int from Python) is the float it means; the key order is the declaration's.
    assert_eq!(canonical(json!({"block": [8, 128], "eps": 1})), one);
    // A default is filled in, written as the type writes it (the shortest decimal of 1e-6f32).
    assert_eq!(
        canonical(json!({"block": [8, 128]}))["params"]["eps"],
        json!(1e-6)
    );
    assert_eq!(
        lib.canonical(
            "norm",
            json!({"block": [8, 128], "eps": 1}).as_object().unwrap()
        )
        .unwrap()
        .to_json()
        .to_string(),
        r#"{"eps":1.0,"block":[8,128]}"#
    );
    // Nothing was built to answer.
    assert_eq!(lib.stats.builds.load(Ordering::Relaxed), 0);
}

/// NaN and the infinities pass exactly (as the strings "nan", "inf", "-inf": JSON has no such
/// numbers), and a finite value past f32's range is refused naming the parameter, not read as `null`.
#[test]
fn non_finite_floats_pass_exactly_and_out_of_range_ones_are_refused() {
    let lib = Library::new("t", vec![norm()]);
    for (given, back) in [("inf", "inf"), ("-inf", "-inf"), ("nan", "nan")] {
        let answer = ask(
            &lib,
            "canonical",
            json!({"kernel": "norm", "params": {"eps": given, "block": [8, 128]}}),
        );
        assert_eq!(answer["params"]["eps"], json!(back), "{answer}");
    }
    let answer = ask(
        &lib,
        "canonical",
        json!({"kernel": "norm", "params": {"eps": 1e308, "block": [8, 128]}}),
    );
    assert_eq!(answer["ok"], json!(false), "{answer}");
    let message = answer["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("eps") && message.contains("outside f32's range"),
        "{answer}"
    );
    assert!(!message.contains("null"), "{answer}");
    // A string that is not one of the three is still not a number.
    let answer = ask(
        &lib,
        "canonical",
        json!({"kernel": "norm", "params": {"eps": "big", "block": [8, 128]}}),
    );
    assert_eq!(answer["ok"], json!(false), "{answer}");
}

#[test]
fn canonical_refuses_unknown_missing_and_mistyped_parameters_naming_them() {
    let lib = Library::new("t", vec![norm()]);
    let error = |params: Value| {
        let a = ask(
            &lib,
            "canonical",
            json!({"kernel": "norm", "params": params}),
        );
        assert_eq!(a["ok"], json!(false), "{a}");
        a["error"].clone()
    };
    let e = error(json!({"block": [8, 128], "epss": 1}));
    assert_eq!(e["argument"], json!("epss"));
    let m = e["message"].as_str().unwrap();
    assert!(
        m.contains("no static parameter `epss`") && m.contains("eps: f32, block: (usize, usize)"),
        "{m}"
    );
    assert!(e["location"].as_str().unwrap().contains("tests.rs"), "{e}");
    let e = error(json!({"eps": 1}));
    assert_eq!(e["argument"], json!("block"));
    assert!(
        e["message"].as_str().unwrap().contains("has no default"),
        "{e}"
    );
    let e = error(json!({"block": [8, 128], "eps": "1e-6"}));
    assert_eq!(e["argument"], json!("eps"));
    assert!(
        e["message"].as_str().unwrap().contains("must be f32"),
        "{e}"
    );
    let e = error(json!({"block": [8, 128, 1]}));
    assert!(
        e["message"].as_str().unwrap().contains("2 elements, got 3"),
        "{e}"
    );
    let a = ask(&lib, "canonical", json!({"kernel": "nope"}));
    assert!(
        a["error"]["message"]
            .as_str()
            .unwrap()
            .contains("no kernel `nope`"),
        "{a}"
    );
}

#[test]
fn an_unknown_method_is_refused_before_anything_is_built() {
    let lib = Library::new("t", vec![norm()]);
    let a = ask(
        &lib,
        "bulid",
        json!({"kernel": "norm", "params": {"block": [8, 128]}}),
    );
    let m = a["error"]["message"].as_str().unwrap();
    assert!(
        m.contains("unknown method `bulid`") && m.contains("canonical"),
        "{m}"
    );
    assert_eq!(lib.stats.builds.load(Ordering::Relaxed), 0);
}

/// A host function as a library would write one: checked arguments, its own errors.
fn split(sizes: Vec<i32>, at: usize) -> Result<(Vec<i32>, Vec<i32>)> {
    if at > sizes.len() {
        return Err(kerr!(Shape, "cannot split {} sizes at {at}", sizes.len()));
    }
    Ok((sizes[..at].to_vec(), sizes[at..].to_vec()))
}

fn with_split() -> Library {
    Library::new("t", vec![norm()]).with_host(vec![HostExport::new("split", split)])
}

#[test]
fn host_functions_are_called_by_name_on_json_arguments() {
    let lib = with_split();
    let a = ask(
        &lib,
        "host",
        json!({"function": "split", "args": [[3, 0, 5], 1]}),
    );
    assert_eq!(a, json!({"ok": true, "result": [[3], [0, 5]]}));
    // The library description lists them with their argument types.
    let d: Value = serde_json::from_str(lib.description().to_str().unwrap()).unwrap();
    assert_eq!(
        d["host"],
        json!([{"name": "split", "args": ["Vec<i32>", "usize"]}])
    );
    assert_eq!(d["problems"], json!([]));
    assert_eq!(
        ask(&Library::new("t", vec![norm()]), "stats", json!({}))["ok"],
        json!(true)
    );
}

#[test]
fn host_call_mistakes_are_errors_naming_what_is_wrong() {
    let lib = with_split();
    let error = |request: Value| {
        let a = ask(&lib, "host", request);
        assert_eq!(a["ok"], json!(false), "{a}");
        a["error"].clone()
    };
    let e = error(json!({"function": "splot", "args": []}));
    assert!(
        e["message"]
            .as_str()
            .unwrap()
            .contains("no host function `splot`; it exports split"),
        "{e}"
    );
    let e = error(json!({"function": "split", "args": [[1]]}));
    assert!(
        e["message"]
            .as_str()
            .unwrap()
            .contains("takes 2 argument(s) (Vec<i32>, usize), got 1"),
        "{e}"
    );
    let e = error(json!({"function": "split", "args": [[1, 2.5], 1]}));
    assert_eq!(e["argument"], json!("argument 0"));
    let m = e["message"].as_str().unwrap();
    assert!(
        m.contains("argument 0 of host function `split` must be Vec<i32>: element 1"),
        "{m}"
    );
    let e = error(json!({"function": "split", "args": [[1], -1]}));
    assert!(
        e["message"].as_str().unwrap().contains("must be usize"),
        "{e}"
    );
    // The function's own error, as it wrote it.
    let e = error(json!({"function": "split", "args": [[1], 2]}));
    assert_eq!(e["kind"], json!("Shape"));
    assert_eq!(e["message"], json!("cannot split 1 sizes at 2"));
    let e = error(json!({"function": "split"}));
    assert!(
        e["message"].as_str().unwrap().contains("a host call is"),
        "{e}"
    );
    let a = ask(
        &Library::new("t", vec![]),
        "host",
        json!({"function": "split", "args": []}),
    );
    assert!(
        a["error"]["message"]
            .as_str()
            .unwrap()
            .contains("it exports none"),
        "{a}"
    );
}

#[test]
fn a_panicking_host_function_is_an_error_and_duplicate_names_a_problem() {
    fn boom(_: bool) -> Result<bool> {
        panic!("boom")
    }
    let lib = Library::new("t", vec![]).with_host(vec![
        HostExport::new("boom", boom),
        HostExport::new("boom", |x: f32, y: (u32, bool)| {
            Ok::<_, KernelError>((x, y.1))
        }),
    ]);
    let a = ask(&lib, "host", json!({"function": "boom", "args": [true]}));
    assert!(
        a["error"]["message"]
            .as_str()
            .unwrap()
            .contains("host function `boom` panicked: boom"),
        "{a}"
    );
    let d: Value = serde_json::from_str(lib.description().to_str().unwrap()).unwrap();
    assert_eq!(
        d["problems"],
        json!(["two host functions are named `boom` (export_library! names each after its Rust function)"])
    );
    assert_eq!(lib.host[1].args, ["f32", "(u32, bool)"]);
}
