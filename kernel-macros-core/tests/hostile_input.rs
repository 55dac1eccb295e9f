//! Regression tests for what the fuzz driver (`tests/fuzz/`) and issue 13 found: each input is
//! lexed from text, so spans have real positions, and goes through the public entry points.

mod common;

use std::str::FromStr;

use proc_macro2::TokenStream;

use common::{extent, inside, raw_equalities, split_errors, CompileError};

fn lex(text: &str) -> TokenStream {
    TokenStream::from_str(text).expect("lexes")
}

/// An expansion's errors (each checked to lie inside the input) and the rest of it as text.
fn expand(
    entry: fn(TokenStream, TokenStream) -> TokenStream,
    attr: &str,
    item: &str,
) -> (Vec<CompileError>, TokenStream) {
    let (attr, item) = (lex(attr), lex(item));
    let input = extent(&attr.clone().into_iter().chain(item.clone()).collect());
    let (errors, rest) = split_errors(&entry(attr, item));
    if let Some(input) = input {
        for error in &errors {
            assert!(
                inside(error, input),
                "{error:?} is outside the input {input:?}"
            );
        }
    }
    (errors, rest)
}

fn kernel(item: &str) -> (Vec<CompileError>, TokenStream) {
    expand(kernel_macros_core::tpu_kernel, "", item)
}

fn normalized(tokens: &TokenStream) -> String {
    tokens.to_string().split_whitespace().collect()
}

// ------------------------------------------------------------------- issue 13 reproducers --

#[test]
fn an_empty_statement_is_accepted() {
    let (errors, rest) = kernel(
        "fn k(x: Ref<f32>, o: RefMut<f32>) {
            o.store(x.load());;
            for i in 0..2 { ; o.store(x.load()); };
        }",
    );
    assert!(errors.is_empty(), "{errors:?}");
    let text = normalized(&rest);
    assert!(text.contains("o.store(x.load());;"), "{text}");
    assert!(text.contains("for_range"), "{text}");
}

const TYPO: &str = "fn k(x: Ref<f32>, o: RefMut<f32>) {
    let i = program_id(0);
    let y = x.load() * ;
    if i == 0 {
        o.store(x.load());
    }
    let last = i != num_programs(0) - 1;
    o.store(select(last, y, y));
}";

#[test]
fn a_syntax_error_is_reported_at_the_typo_and_the_rest_of_the_body_is_rewritten() {
    let (errors, rest) = kernel(TYPO);
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(errors[0].line, 3, "{errors:?}");
    // Every comparison of the correct lines is traced, none left as Rust's `==`/`!=`.
    assert_eq!(raw_equalities(&rest), Vec::<usize>::new());
    let text = normalized(&rest);
    for rewritten in ["TraceEq::trace_eq(i,0)", "TraceEq::trace_ne(i,", "if_else("] {
        assert!(text.contains(rewritten), "{rewritten} in {text}");
    }
    // The broken statement is kept as written, for rustc (and the IDE) to see.
    assert!(text.contains("lety=x.load()*;"), "{text}");
}

#[test]
fn a_syntax_error_inside_a_loop_leaves_the_loop_and_its_other_lines_rewritten() {
    let item = "fn k(x: Ref<f32>, o: RefMut<f32>) {
        let mut acc = x.load();
        for j in 0..4 {
            acc = acc + ;
            if j == 1 { acc = acc * 2.0; }
        }
        o.store(acc);
    }";
    let (errors, rest) = kernel(item);
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(errors[0].line, 4, "{errors:?}");
    assert_eq!(raw_equalities(&rest), Vec::<usize>::new());
    let text = normalized(&rest);
    assert!(text.contains("for_range(0,4"), "{text}");
    assert!(text.contains("TraceEq::trace_eq(j,1)"), "{text}");
}

/// A missing `;` joins two statements into one chunk: the statement after it is still rewritten.
#[test]
fn a_missing_semicolon_leaves_the_next_statement_rewritten() {
    let item = "fn k(x: Ref<f32>, o: RefMut<f32>) {
        let i = program_id(0);
        let y = x.load() * 2.0
        if i == 0 {
            o.store(y);
        }
        let last = i == num_programs(0) - 1;
        o.store(select(last, y, x.load()))
        o.store(y)
    }";
    let (errors, rest) = kernel(item);
    let lines: Vec<usize> = errors.iter().map(|e| e.line).collect();
    assert_eq!(lines, [4, 9], "{errors:?}");
    assert_eq!(raw_equalities(&rest), Vec::<usize>::new());
    let text = normalized(&rest);
    assert!(text.contains("lety=x.load()*2.0;"), "{text}");
    assert!(
        text.contains("if_else(::tpu_kernel::__private::TraceEq::trace_eq(i,0)"),
        "{text}"
    );
    assert!(
        text.contains("o.store(select(last,y,x.load()));o.store(y)}"),
        "{text}"
    );
}

#[test]
fn every_syntax_error_of_a_body_is_reported() {
    let item = "fn k(x: Ref<f32>, o: RefMut<f32>) {
        let a = x.load() + ;
        let b = (a == );
        o.store(a);
    }";
    let (errors, _) = kernel(item);
    let lines: Vec<usize> = errors.iter().map(|e| e.line).collect();
    assert_eq!(lines, [2, 3], "{errors:?}");
}

#[test]
fn check_errors_are_reported_next_to_syntax_errors() {
    let (errors, rest) = kernel(
        "fn k(x: Ref<f32>, o: RefMut<f32>) {
            let a = x.load() + ;
            let b = match x { _ => x.load() };
            if b == a { o.store(b); }
        }",
    );
    let messages: Vec<&str> = errors.iter().map(|e| e.message.as_str()).collect();
    assert_eq!(errors.len(), 2, "{messages:?}");
    assert!(
        messages[1].contains("`match` cannot be traced"),
        "{messages:?}"
    );
    assert!(normalized(&rest).contains("TraceEq::trace_eq(b,a)"));
}

// ------------------------------------------------------------------------ fuzz findings --

/// Running out of tokens was reported at the call site (for an attribute, rustc points at the
/// attribute); now at the last token there is.
#[test]
fn a_truncated_item_is_reported_at_its_last_token() {
    for (entry, attr, item) in [
        (
            kernel_macros_core::tpu_kernel as fn(_, _) -> _,
            "",
            "fn k(x: Ref<f32>)",
        ),
        (
            kernel_macros_core::kernel_fn,
            "",
            "pub fn helper(x: Array<f32>) -> Array<f32>",
        ),
        (kernel_macros_core::tpu_kernel, "", "matmul_cost"),
        (kernel_macros_core::tpu_kernel, "", "MyKernel !"),
        (
            kernel_macros_core::export,
            "",
            "pub fn add(x: ArrayType) -> Result<PallasCall, KernelError>",
        ),
        (
            kernel_macros_core::export,
            "grad",
            "pub fn add(x: ArrayType) -> Result<PallasCall, KernelError> {}",
        ),
        (
            kernel_macros_core::export,
            "name =",
            "pub fn add(x: ArrayType) -> Result<PallasCall, KernelError> {}",
        ),
    ] {
        let (errors, _) = expand(entry, attr, item);
        assert!(!errors.is_empty(), "{attr} {item}");
    }
    let (errors, _) = expand(
        |_, input| kernel_macros_core::export_library(input),
        "",
        "\"lib\" ,",
    );
    assert!(!errors.is_empty());
}

/// `#[export]` reported every launch fn that did not parse at the call site, with a generic
/// message; now syn's error where it is.
#[test]
fn an_export_that_does_not_parse_is_reported_where_it_breaks() {
    let item =
        "pub fn add(x: ArrayType y: ArrayType) -> Result<PallasCall, KernelError> { todo!() }";
    let (errors, rest) = expand(kernel_macros_core::export, "", item);
    assert_eq!(errors.len(), 1, "{errors:?}");
    let at = errors[0].column;
    assert_eq!(&item[at..at + 1], "y", "{errors:?}");
    // The item is still emitted, so its name resolves.
    assert!(normalized(&rest).contains("pubfnadd"));

    let (errors, _) = expand(kernel_macros_core::export, "", "struct NotAFunction;");
    assert_eq!(errors.len(), 1);
    assert!(errors[0]
        .message
        .contains("#[export] goes on a launch function"));
}

/// A launch fn's body is plain Rust: passed through as written, so a typo there is rustc's to
/// report and the export's descriptor is still generated (`export_library!` finds it).
#[test]
fn an_export_body_is_passed_through_as_written() {
    let item = "pub fn add(x: ArrayType) -> Result<PallasCall, KernelError> { let a = ; a }";
    let (errors, rest) = expand(kernel_macros_core::export, "", item);
    assert!(errors.is_empty(), "{errors:?}");
    let text = normalized(&rest);
    assert!(text.contains("{leta=;a}"), "{text}");
    assert!(text.contains("fn__tpu_kernel_export_add()"), "{text}");
}

/// `super += x` in a loop made `super` a carried variable: a closure parameter named `super`.
#[test]
fn keywords_assigned_in_a_loop_are_not_carried() {
    for keyword in ["super", "Self", "self"] {
        let item = format!(
            "fn k(x: Ref<f32>, o: RefMut<f32>) {{ for p in 0..2 {{ {keyword} += x.load(); }} }}"
        );
        let (errors, rest) = kernel(&item);
        assert!(errors.is_empty(), "{errors:?}");
        syn::parse2::<syn::File>(rest.clone())
            .unwrap_or_else(|e| panic!("{keyword}: {e} in {rest}"));
    }
}
