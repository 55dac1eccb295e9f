//! Unit tests: carried-variable analysis, the shape of each rewrite, and the
//! rejections (message and span). End-to-end behaviour of the generated code
//! is covered by `tests/mock_runtime.rs`.

use std::str::FromStr;

use proc_macro2::TokenStream as TokenStream2;
use quote::quote;

use crate::parse::{parse, MacroKind};
use crate::{carried, check, expand, generate};

// ---------------------------------------------------------------- helpers --

/// Removes all whitespace, so expected token strings can be written readably.
fn norm(s: &str) -> String {
    s.split_whitespace().collect()
}

/// Expands a valid `#[kernel_fn]` and returns the normalized output.
fn gen(item: TokenStream2) -> String {
    gen_kind(MacroKind::KernelFn, item)
}

fn gen_kind(kind: MacroKind, item: TokenStream2) -> String {
    let kernel = parse(kind, quote!(), item).expect("parses");
    if let Err(err) = check::check(&kernel) {
        panic!("unexpected errors: {:?}", messages(err));
    }
    norm(&generate::generate(kernel).to_string())
}

#[track_caller]
fn assert_contains(haystack: &str, needle: &str) {
    let needle = norm(needle);
    assert!(
        haystack.contains(&needle),
        "expected\n  {needle}\nin\n  {haystack}"
    );
}

fn messages(err: syn::Error) -> Vec<String> {
    err.into_iter().map(|e| e.to_string()).collect()
}

/// The error messages of `check` for an item (empty when it is accepted).
fn errors_kind(kind: MacroKind, attr: TokenStream2, item: TokenStream2) -> Vec<String> {
    let kernel = parse(kind, attr, item).expect("parses");
    match check::check(&kernel) {
        Ok(()) => Vec::new(),
        Err(err) => messages(err),
    }
}

/// Errors for a `#[kernel_fn]` whose body is `body`.
fn body_errors(body: TokenStream2) -> Vec<String> {
    errors_kind(MacroKind::KernelFn, quote!(), quote!(fn f() { #body }))
}

#[track_caller]
fn assert_body_error(body: TokenStream2, expected: &str) {
    let errors = body_errors(body);
    assert!(
        errors.iter().any(|e| e.contains(expected)),
        "expected an error containing {expected:?}, got {errors:?}"
    );
}

fn names(idents: Vec<proc_macro2::Ident>) -> Vec<String> {
    idents.into_iter().map(|i| i.to_string()).collect()
}

fn block(tokens: TokenStream2) -> syn::Block {
    syn::parse2(tokens).expect("block")
}

fn carried_block(tokens: TokenStream2) -> Vec<String> {
    names(carried::assigned_in_block(&block(tokens)))
}

/// Parses real source text, so spans have line/column information.
fn source_errors(kind: MacroKind, src: &str) -> Vec<(String, usize, usize)> {
    let item = TokenStream2::from_str(src).expect("tokens");
    let kernel = parse(kind, quote!(), item).expect("parses");
    let err = check::check(&kernel).expect_err("rejected");
    err.into_iter()
        .map(|e| {
            let start = e.span().start();
            (e.to_string(), start.line, start.column)
        })
        .collect()
}

// ------------------------------------------------------ carried variables --

#[test]
fn carried_plain_and_compound_assignments() {
    assert_eq!(
        carried_block(quote!({
            x = 1;
            y += 2;
            z *= 3;
            w <<= 1;
        })),
        ["x", "y", "z", "w"]
    );
}

#[test]
fn carried_order_of_first_assignment_without_duplicates() {
    assert_eq!(
        carried_block(quote!({
            b = 1;
            a = 2;
            b = 3;
            a += 1;
        })),
        ["b", "a"]
    );
}

#[test]
fn carried_excludes_reads_and_calls() {
    assert_eq!(
        carried_block(quote!({
            let y = x + 1;
            o.store(y);
            f(z);
        })),
        Vec::<String>::new()
    );
}

#[test]
fn carried_let_shadows_from_the_next_statement_on() {
    // assigned before the `let`: the outer variable.
    assert_eq!(
        carried_block(quote!({
            x = 1;
            let x = 2;
            x = 3;
        })),
        ["x"]
    );
    // assigned only after the `let`: local.
    assert_eq!(
        carried_block(quote!({
            let mut x = 2;
            x = 3;
            x += 1;
        })),
        Vec::<String>::new()
    );
    // the initializer still sees the outer variable.
    assert_eq!(
        carried_block(quote!({
            let x = {
                x = 1;
                2
            };
        })),
        ["x"]
    );
}

#[test]
fn carried_let_in_nested_block_does_not_leak() {
    assert_eq!(
        carried_block(quote!({
            {
                let mut y = 0;
                y = 1;
            }
            y = 2;
        })),
        ["y"]
    );
    // a `let` in an enclosing block covers nested blocks.
    assert_eq!(
        carried_block(quote!({
            let mut y = 0;
            {
                {
                    y = 1;
                }
            }
        })),
        Vec::<String>::new()
    );
    // typed and tuple patterns declare every name.
    assert_eq!(
        carried_block(quote!({
            let (mut a, (mut b, _)): (i32, (i32, i32)) = t;
            a = 1;
            b = 2;
            c = 3;
        })),
        ["c"]
    );
}

#[test]
fn carried_looks_inside_nested_control_flow() {
    assert_eq!(
        carried_block(quote!({
            if c {
                a = 1;
            } else if d {
                b += 1;
            } else {
                e = 2;
            }
            for i in 0..n {
                f = f + i;
            }
            while k < n {
                k += 1;
            }
        })),
        ["a", "b", "e", "f", "k"]
    );
}

#[test]
fn carried_loop_bindings_are_local() {
    let body = block(quote!({
        i = 3;
        acc = acc + i;
    }));
    let pat: syn::Pat = syn::parse_quote!(i);
    assert_eq!(names(carried::assigned_in_loop(Some(&pat), &body)), ["acc"]);
    // the index of a nested `for` is local to that loop only.
    assert_eq!(
        carried_block(quote!({
            for x in 0..n {
                x = 1;
            }
            x = 2;
        })),
        ["x"]
    );
}

#[test]
fn carried_destructuring_and_places() {
    assert_eq!(
        carried_block(quote!({
            (a, _, (b, [c, d])) = t;
        })),
        ["a", "b", "c", "d"]
    );
    assert_eq!(
        carried_block(quote!({
            t.0 = 1;
            v[i] += 2;
            (s).x.y = 3;
        })),
        ["t", "v", "s"]
    );
}

#[test]
fn carried_union_keeps_first_order() {
    let a = carried_block(quote!({
        x = 1;
        y = 2;
    }));
    let b = carried_block(quote!({
        z = 1;
        x = 2;
    }));
    let to_idents = |v: &[String]| -> Vec<proc_macro2::Ident> {
        v.iter().map(|s| quote::format_ident!("{}", s)).collect()
    };
    assert_eq!(
        names(carried::union(&to_idents(&a), &to_idents(&b))),
        ["x", "y", "z"]
    );
}

// ------------------------------------------------------------- rewrites --

#[test]
fn rewrite_comparisons_and_logic() {
    let out = gen(quote!(
        fn f(a: A, b: A) {
            let _ = (a == b, a != b, a < b, a <= b, a > b, a >= b, a && b, a || b);
        }
    ));
    for (path, method) in [
        ("TraceEq", "trace_eq"),
        ("TraceEq", "trace_ne"),
        ("TraceOrd", "trace_lt"),
        ("TraceOrd", "trace_le"),
        ("TraceOrd", "trace_gt"),
        ("TraceOrd", "trace_ge"),
        ("TraceLogic", "trace_and"),
        ("TraceLogic", "trace_or"),
    ] {
        assert_contains(
            &out,
            &format!(":: tpu_kernel :: __private :: {path} :: {method} (a, b)"),
        );
    }
    assert!(!out.contains("==") && !out.contains("&&") && !out.contains("||"));
}

#[test]
fn rewrite_comparisons_recursively_and_without_operand_parens() {
    let out = gen(quote!(
        fn f() -> S {
            g((x + 1) == y && h(a < b), [c >= d]).at(e != 0)
        }
    ));
    assert_contains(
        &out,
        "::tpu_kernel::__private::TraceLogic::trace_and(\
           ::tpu_kernel::__private::TraceEq::trace_eq(x + 1, y), \
           h(::tpu_kernel::__private::TraceOrd::trace_lt(a, b)))",
    );
    assert_contains(&out, "[::tpu_kernel::__private::TraceOrd::trace_ge(c, d)]");
    assert_contains(
        &out,
        ".at(::tpu_kernel::__private::TraceEq::trace_ne(e, 0))",
    );
    // arithmetic and compound assignment are left to operator overloading.
    let out = gen(quote!(
        fn f() {
            acc += x * 2 - -y;
        }
    ));
    assert_contains(&out, "acc += x * 2 - -y;");
}

#[test]
fn rewrite_if_with_carried_variable_and_no_else() {
    let out = gen(quote!(
        fn f() {
            let mut x = 0;
            if c == 0 {
                x = 1;
            }
        }
    ));
    assert_contains(
        &out,
        "{ let (__tk_vars, __tk_value) = ::tpu_kernel::__private::if_else(\
             ::tpu_kernel::__private::TraceEq::trace_eq(c, 0), (x,), \
             |(mut x,)| { let __tk_value = { x = 1; }; ((x,), __tk_value) }, \
             |(x,)| ((x,), ())); \
           #[allow(unused_assignments)] { (x,) = __tk_vars; } \
           __tk_value }",
    );
}

#[test]
fn rewrite_if_mut_only_in_the_assigning_branch() {
    let out = gen(quote!(
        fn f() -> T {
            if c {
                a = 1;
                p
            } else {
                b += 2;
                q
            }
        }
    ));
    assert_contains(
        &out,
        "if_else(c, (a, b,), |(mut a, b,)| { let __tk_value = { a = 1; p };",
    );
    assert_contains(
        &out,
        "|(a, mut b,)| { let __tk_value = { b += 2; q }; ((a, b,), __tk_value) }",
    );
    assert_contains(&out, "{ (a, b,) = __tk_vars; } __tk_value }");
}

#[test]
fn rewrite_if_without_carried_variables() {
    let out = gen(quote!(
        fn f() -> T {
            let y = if c { 1 } else { 2 };
            y
        }
    ));
    assert_contains(
        &out,
        "let y = { let ((), __tk_value) = ::tpu_kernel::__private::if_else(c, (), \
             |()| { let __tk_value = { 1 }; ((), __tk_value) }, \
             |()| { let __tk_value = { 2 }; ((), __tk_value) }); \
           __tk_value };",
    );
    assert!(!out.contains("__tk_vars"));
}

#[test]
fn rewrite_else_if_chain_nests() {
    let out = gen(quote!(
        fn f() {
            if a {
                x = 1;
            } else if b {
                y = 2;
            } else {
                z = 3;
            }
        }
    ));
    // outer `if` carries the union of all branches ...
    assert_contains(&out, "if_else(a, (x, y, z,), |(mut x, y, z,)|");
    // ... its else closure holds the rewritten inner `if` directly.
    assert_contains(
        &out,
        "|(x, mut y, mut z,)| { let __tk_value = { let (__tk_vars, __tk_value) = \
             ::tpu_kernel::__private::if_else(b, (y, z,), |(mut y, z,)|",
    );
    assert!(!out.contains("elseif") && !out.contains("else{"));
}

#[test]
fn rewrite_for_range() {
    let out = gen(quote!(
        fn f() {
            let mut acc = zeros();
            for i in 0..n {
                let s = i * 8;
                acc = acc + x.at(s).load();
            }
        }
    ));
    assert_contains(
        &out,
        "{ let __tk_vars = ::tpu_kernel::__private::for_range(0, n, (acc,), \
             |i, (mut acc,)| { { let s = i * 8; acc = acc + x.at(s).load(); } (acc,) }); \
           #[allow(unused_assignments)] { (acc,) = __tk_vars; } }",
    );
}

#[test]
fn rewrite_for_range_step_parenthesized_and_without_carried() {
    let out = gen(quote!(
        fn f() {
            for _ in ((lo)..(hi + 1)).step_by((2)) {
                o.store(x);
            }
        }
    ));
    assert_contains(
        &out,
        "{ let () = ::tpu_kernel::__private::for_range_step(lo, hi + 1, 2, (), |_, ()| { o.store(x); }); }",
    );
}

#[test]
fn rewrite_while_loop() {
    let out = gen(quote!(
        fn f() {
            let mut i = 0;
            let mut acc = 0;
            while (i < n) {
                acc = acc + i;
                i += 1;
            }
        }
    ));
    assert_contains(
        &out,
        "{ let __tk_vars = ::tpu_kernel::__private::while_loop((acc, i,), \
             |(_, i,)| ::tpu_kernel::__private::TraceOrd::trace_lt(i, n), \
             |(mut acc, mut i,)| { { acc = acc + i; i += 1; } (acc, i,) }); \
           #[allow(unused_assignments)] { (acc, i,) = __tk_vars; } }",
    );
}

#[test]
fn rewrite_nested_loops_and_branches() {
    let out = gen(quote!(
        fn f() {
            for i in 0..n {
                while k < i {
                    if k == 2 {
                        acc += k;
                    }
                    k += 1;
                }
            }
        }
    ));
    assert_contains(&out, "for_range(0, n, (acc, k,), |i, (mut acc, mut k,)|");
    assert_contains(&out, "while_loop((acc, k,), |(_, k,)|");
    assert_contains(
        &out,
        "if_else(::tpu_kernel::__private::TraceEq::trace_eq(k, 2), (acc,), |(mut acc,)|",
    );
}

#[test]
fn rewrite_leaves_compile_time_code_alone() {
    let out = gen(quote!(
        fn f() {
            const N: bool = 1 == 1;
            let a = [0; M == 1];
            let b = const { 2 < 3 };
        }
    ));
    assert_contains(&out, "const N: bool = 1 == 1;");
    assert_contains(&out, "[0; M == 1]");
    assert_contains(&out, "const { 2 < 3 }");
}

#[test]
fn rewrite_keeps_the_signature() {
    let out = gen_kind(
        MacroKind::Kernel,
        quote!(
            #[doc = "k"]
            pub(crate) fn k<T: Copy>(x: Ref<T>, mut o: RefMut<T>)
            where
                T: Dtype,
            {
                o.store(x.load());
            }
        ),
    );
    assert_contains(
        &out,
        "#[doc = \"k\"] pub(crate) fn k<T: Copy>(x: Ref<T>, mut o: RefMut<T>) where T: Dtype, { o.store(x.load()); }",
    );
}

#[test]
fn expand_accepts_the_brief_examples() {
    let out = expand(
        MacroKind::Kernel,
        quote!(),
        quote!(
            fn fori_rowsum_kernel(x: Ref<f32>, o: RefMut<f32>) {
                let n_chunks = x.shape()[0] / 8;
                let mut acc = full(o.shape(), 0.0f32);
                for i in 0..n_chunks {
                    let start = multiple_of(i * 8, 8);
                    acc = acc + x.at((ds(start, 8), ..)).load();
                }
                o.store(acc);
            }
        ),
    )
    .to_string();
    assert!(!out.contains("compile_error"), "{out}");
    assert_contains(
        &norm(&out),
        "for_range(0, n_chunks, (acc,), |i, (mut acc,)|",
    );
}

// ------------------------------------------------------------ rejections --

#[test]
fn reject_closures_return_references_match() {
    assert_body_error(quote!(let g = |x| x + 1;), "closures cannot be traced");
    assert_body_error(quote!(return x;), "`return` cannot be traced");
    assert_body_error(quote!(f(&x);), "references cannot be traced");
    assert_body_error(quote!(f(&mut x);), "pass them by value");
    assert_body_error(
        quote!(match x { _ => 1 };),
        "`match` cannot be traced; use `if`/`else`",
    );
}

#[test]
fn reject_loop_break_continue_labels() {
    assert_body_error(
        quote!(loop {
            x += 1;
        }),
        "`loop` cannot be traced; use `while cond { .. }`",
    );
    assert_body_error(
        quote!(for i in 0..n {
            break;
        }),
        "`break` cannot be traced (scf.for has no early exit)",
    );
    assert_body_error(
        quote!(while c {
            continue;
        }),
        "`continue` cannot be traced",
    );
    assert_body_error(quote!('outer: for i in 0..n {}), "labels cannot be traced");
    assert_body_error(quote!('outer: while c {}), "labels cannot be traced");
}

#[test]
fn reject_if_let_while_let() {
    assert_body_error(
        quote!(if let Some(x) = y {}),
        "`if let` cannot be traced; use a traced condition",
    );
    assert_body_error(
        quote!(if a && let Some(x) = y { }),
        "`if let` cannot be traced",
    );
    assert_body_error(
        quote!(while let Some(x) = y {}),
        "`while let` cannot be traced",
    );
}

#[test]
fn reject_for_loop_shapes() {
    let range = "a traced `for` loop iterates over a range `lo..hi` (lowered to scf.for)";
    assert_body_error(quote!(for x in v.iter() {}), range);
    assert_body_error(quote!(for x in 0.. {}), range);
    assert_body_error(quote!(for x in v {}), range);
    assert_body_error(quote!(for i in 0..=n {}), "use a half-open range `lo..hi`");
    assert_body_error(
        quote!(for i in (0..=n).step_by(2) {}),
        "use a half-open range `lo..hi`",
    );
    assert_body_error(
        quote!(for (a, b) in 0..n {}),
        "binds its index to a name or `_`",
    );
}

#[test]
fn reject_async_unsafe_try_yield_await() {
    assert_body_error(
        quote!(let a = async { 1 };),
        "`async` blocks cannot be traced",
    );
    assert_body_error(quote!(let a = x.await;), "`.await` cannot be traced");
    assert_body_error(quote!(unsafe { f() };), "`unsafe` blocks cannot be traced");
    assert_body_error(quote!(let a = f()?;), "the `?` operator cannot be traced");
}

#[test]
fn reject_macros_in_statement_and_expression_position() {
    assert_body_error(
        quote!(println!("hi");),
        "macros cannot be traced inside a kernel",
    );
    assert_body_error(
        quote!(let v = format!("{}", 2);),
        "macros cannot be traced inside a kernel",
    );
}

/// A list of copy descriptors, Pallas's Python list of `make_async_copy`: `vec![..]` and `unroll` of
/// any iterable are Rust at trace time (not checked as traced code).
#[test]
fn vec_and_unrolled_loops_over_any_iterable_are_rust() {
    let errors = body_errors(quote! {
        let mut copies = vec![];
        for p in unroll(0..4) {
            copies.push(async_copy(x.at(p), buf.at(p), sem));
        }
        for c in unroll(&copies) {
            c.start();
        }
        for (p, c) in unroll(copies.iter().enumerate()) {
            c.wait();
        }
    });
    assert_eq!(errors, Vec::<String>::new());
}

#[test]
fn reject_bad_lets_and_items() {
    assert_body_error(
        quote!(let x;),
        "initialize the variable where it is declared",
    );
    assert_body_error(
        quote!(let Some(x) = y else { panic() };),
        "`let .. else` cannot be traced",
    );
    // one mistake, one error (the refutable pattern is not reported separately).
    assert_eq!(
        body_errors(quote!(let Some(x) = y else { panic() };)).len(),
        1
    );
    assert_body_error(quote!(let Foo { a } = y;), "this pattern cannot be traced");
    assert_body_error(quote!(let ref x = y;), "`ref` bindings cannot be traced");
    assert_body_error(
        quote!(
            fn helper() {}
        ),
        "items cannot be defined inside a kernel",
    );
    assert_body_error(
        quote!(
            struct S;
        ),
        "items cannot be defined inside a kernel",
    );
    assert_body_error(
        quote!(
            static mut C: i32 = 0;
        ),
        "items cannot be defined inside a kernel",
    );
    // `use` and `const` are fine.
    assert_eq!(
        body_errors(quote!(
            use core::cmp;
            const N: usize = 8;
        )),
        Vec::<String>::new()
    );
}

#[test]
fn methods_are_left_to_rustc() {
    // No hand-kept method list: an unknown method (`x.lod()`) is rustc's E0599 at the user's token,
    // with its "similar name" hint (tests/compile-fail/ui/unknown_method.stderr), not a second macro error.
    assert_eq!(
        body_errors(quote!(let y = x.lod(); let z = x.frobnicate(); let w = shape.iter().count();)),
        Vec::<String>::new()
    );
}

#[test]
fn reject_struct_literals_stray_ranges_and_other_syntax() {
    assert_body_error(
        quote!(let s = S { a: 1 };),
        "struct literals cannot be traced",
    );
    assert_body_error(
        quote!(let r = 0..n;),
        "a range can only be the iterable of a traced `for` loop or an argument",
    );
    assert_body_error(
        quote!(f(_);),
        "this expression cannot be traced in a kernel",
    );
    // ranges as arguments, tuple elements and indices are fine.
    assert_eq!(
        body_errors(quote!(let a = x.at((ds(s, 8), ..)); let b = f(0..n); let c = shape[1..];)),
        Vec::<String>::new()
    );
}

#[test]
fn reject_bad_signatures() {
    let k = |item: TokenStream2| errors_kind(MacroKind::Kernel, quote!(), item);
    let errors = k(quote!(
        fn k(o: &mut f32, x: &Ref<f32>) -> i32 {}
    ));
    assert_eq!(errors.len(), 3, "{errors:?}");
    assert!(errors[0].contains("a #[tpu_kernel] function returns nothing; outputs are written through RefMut parameters with `.store(..)`"));
    assert!(errors[1].contains("pass Ref<T>/RefMut<T> handles by value, e.g. `o: RefMut<f32>`"));
    assert!(errors[2].contains("pass Ref<T>/RefMut<T> handles by value"));
    assert!(k(quote!(
        fn k(self) {}
    ))[0]
        .contains("cannot take `self`"));
    assert!(k(quote!(
        fn k((a, b): (A, B)) {}
    ))[0]
        .contains("must be a plain name"));
    assert!(k(quote!(
        fn k() -> () {}
    ))
    .is_empty());

    let both = |item: TokenStream2| {
        (
            errors_kind(MacroKind::Kernel, quote!(), item.clone()),
            errors_kind(MacroKind::KernelFn, quote!(), item),
        )
    };
    for (item, expected) in [
        (
            quote!(
                async fn k() {}
            ),
            "cannot be `async`",
        ),
        (
            quote!(
                const fn k() {}
            ),
            "cannot be a `const fn`",
        ),
        (
            quote!(
                unsafe fn k() {}
            ),
            "cannot be an `unsafe fn`",
        ),
        (
            quote!(
                extern "C" fn k() {}
            ),
            "cannot have an `extern` ABI",
        ),
        (
            quote!(
                fn k(a: i32, ...) {}
            ),
            "cannot be variadic",
        ),
    ] {
        let (kernel, helper) = both(item);
        assert!(
            kernel
                .iter()
                .any(|e| e.contains(expected) && e.contains("#[tpu_kernel]")),
            "{kernel:?}"
        );
        assert!(
            helper
                .iter()
                .any(|e| e.contains(expected) && e.contains("#[kernel_fn]")),
            "{helper:?}"
        );
    }
    // #[kernel_fn] allows any parameters and return type.
    assert!(errors_kind(
        MacroKind::KernelFn,
        quote!(),
        quote!(
            fn h(&self, (a, b): (A, B), r: &A) -> A {
                a
            }
        )
    )
    .is_empty());
}

#[test]
fn reject_attribute_arguments_and_non_functions() {
    let errors = errors_kind(
        MacroKind::Kernel,
        quote!(grid = 4),
        quote!(
            fn k() {}
        ),
    );
    assert_eq!(
        errors,
        ["#[tpu_kernel] takes no arguments; write `#[tpu_kernel]`"]
    );
    let err = parse(
        MacroKind::KernelFn,
        quote!(),
        quote!(
            struct S;
        ),
    )
    .err()
    .expect("rejected");
    assert!(err
        .to_string()
        .contains("#[kernel_fn] can only be applied to a function"));
}

#[test]
fn all_errors_are_reported_at_once() {
    let errors = errors_kind(
        MacroKind::Kernel,
        quote!(),
        quote!(
            async fn k(o: &f32) -> u8 {
                let f = |x| x;
                if let Some(a) = b {
                    return;
                }
                println!("x");
                loop {}
            }
        ),
    );
    assert_eq!(errors.len(), 8, "{errors:?}");
}

#[test]
fn errors_are_spanned_at_the_offending_tokens() {
    let src = "fn k(x: Ref<f32>, o: RefMut<f32>) {\n\
               \x20   let y = match x { _ => x };\n\
               \x20   for i in v.iter() {\n\
               \x20       o.store(|z| z);\n\
               \x20   }\n\
               }";
    let errors = source_errors(MacroKind::Kernel, src);
    let at = |needle: &str| {
        errors
            .iter()
            .find(|(m, _, _)| m.contains(needle))
            .map(|(_, line, col)| (*line, *col))
    };
    assert_eq!(at("`match` cannot be traced"), Some((2, 12)));
    assert_eq!(at("iterates over a range"), Some((3, 13)));
    assert_eq!(at("closures cannot be traced"), Some((4, 16)));

    let errors = source_errors(MacroKind::Kernel, "fn k(o: &mut f32) -> i32 {}");
    assert_eq!((errors[0].1, errors[0].2), (1, 18)); // `->`
    assert_eq!((errors[1].1, errors[1].2), (1, 8)); // `&mut f32`
}

#[test]
fn error_output_keeps_the_function() {
    let out = expand(
        MacroKind::Kernel,
        quote!(),
        quote!(
            fn k(o: RefMut<f32>) {
                if c == 1 {
                    println!("x");
                }
                o.store(x);
            }
        ),
    );
    let out = norm(&out.to_string());
    assert!(out.starts_with("::core::compile_error!"), "{out}");
    assert_contains(&out, "fn k(#[allow(unused_mut)] mut o: RefMut<f32>)");
    // best effort: still rewritten, so no follow-up type errors on `==`/`if`.
    assert_contains(
        &out,
        "if_else(::tpu_kernel::__private::TraceEq::trace_eq(c, 1)",
    );
    // non-functions are emitted untouched after the error.
    let out = norm(
        &expand(
            MacroKind::Kernel,
            quote!(),
            quote!(
                struct S;
            ),
        )
        .to_string(),
    );
    assert!(out.ends_with("structS;"), "{out}");
}

#[test]
fn error_output_does_not_move_escapes_into_closures() {
    let out = norm(
        &expand(
            MacroKind::KernelFn,
            quote!(),
            quote!(
                fn h() -> i32 {
                    if a == b {
                        return 1;
                    }
                    for i in 0..n {
                        break;
                    }
                    2
                }
            ),
        )
        .to_string(),
    );
    assert!(
        out.contains("if::tpu_kernel::__private::TraceEq::trace_eq(a,b){return1;}"),
        "{out}"
    );
    assert!(out.contains("foriin0..n{break;}"), "{out}");
    assert!(
        !out.contains("if_else") && !out.contains("for_range"),
        "{out}"
    );
}

#[test]
fn rewrite_unrolled_loop_keeps_a_rust_loop() {
    let out = gen(quote!(
        fn f() {
            let mut acc = zero();
            for p in unroll(0..n) {
                acc = acc + x.at((p, ..)).load();
            }
            for _ in unroll((lo..hi).step_by(2)) {}
        }
    ));
    assert_contains(
        &out,
        "for p in ::tpu_kernel::__private::unroll_range(0, n) { acc = acc + x.at((p, ..)).load(); }",
    );
    assert_contains(
        &out,
        "for _ in ::tpu_kernel::__private::unroll_range_step(lo, hi, 2) {}",
    );
    // Nothing carried, no scf.for builder.
    assert!(!out.contains("for_range"), "{out}");
    assert!(!out.contains("__tk_vars"), "{out}");
}

#[test]
fn reject_unrolled_loop_shapes() {
    assert_body_error(
        quote!(for p in unroll(0..=n) {}),
        "use a half-open range `lo..hi`",
    );
    assert_body_error(
        quote!(for (a, b) in unroll(0..n) {}),
        "binds its index to a name or `_`",
    );
    assert_body_error(
        quote!(for p in unroll(0..n) {
            break;
        }),
        "`break` cannot be traced",
    );
}

#[test]
fn rewrite_compound_assignment_on_a_window_only() {
    let out = gen(quote!(
        fn f(o: RefMut<f32>) {
            o += v;
            acc.0 -= 1;
            a[i] *= 2;
            o.at((ds(i, 8), ..)) += v;
            (c.at(0)) %= 3;
        }
    ));
    // Places keep Rust's operator (RefMut implements `AddAssign`).
    assert_contains(&out, "o += v;");
    assert_contains(&out, "acc.0 -= 1;");
    assert_contains(&out, "a[i] *= 2;");
    // A window is not a place: taken by value.
    assert_contains(
        &out,
        "::tpu_kernel::__private::TraceCompoundAssign::<::tpu_kernel::__private::AddOp, _>::trace_compound_assign(o.at((ds(i, 8), ..)), v);",
    );
    assert_contains(
        &out,
        "::tpu_kernel::__private::TraceCompoundAssign::<::tpu_kernel::__private::RemOp, _>::trace_compound_assign(c.at(0), 3);",
    );
}

#[test]
fn ref_mut_parameters_become_mutable_bindings() {
    let out = gen_kind(
        MacroKind::Kernel,
        quote!(
            fn k(
                x: Ref<f32>,
                o: RefMut<f32>,
                mut s: tpu_kernel::prelude::RefMut<i32, Smem>,
                n: usize,
            ) {
            }
        ),
    );
    assert_contains(
        &out,
        "fn k(x: Ref<f32>, #[allow(unused_mut)] mut o: RefMut<f32>, mut s: tpu_kernel::prelude::RefMut<i32, Smem>, n: usize",
    );
}

// ------------------------------------------------------------------------------------ export_library!

fn library(input: TokenStream2) -> String {
    norm(&crate::export::export_library(input).to_string())
}

#[test]
fn export_library_lists_kernels_and_host_functions_by_their_names() {
    let out = library(quote!(
        "lib",
        [m::add, mul],
        host = [grouped::group_metadata, helper],
    ));
    assert_contains(
        &out,
        "Library::new(\"lib\", ::std::vec![<m::add as ::tpu_kernel::__private::export::ExportedKernel>::export(), <mul as ::tpu_kernel::__private::export::ExportedKernel>::export()])",
    );
    assert_contains(
        &out,
        ".with_host(::std::vec![::tpu_kernel::__private::export::HostExport::new(\"group_metadata\", grouped::group_metadata), ::tpu_kernel::__private::export::HostExport::new(\"helper\", helper)])",
    );
    // `host` is optional: no host functions.
    assert_contains(&library(quote!("lib", [add])), ".with_host(::std::vec![])");
    assert_contains(&library(quote!("lib", [add],)), ".with_host(::std::vec![])");
}

#[test]
fn export_library_declares_its_own_allocator_unless_told_system() {
    let declared = "#[global_allocator]static__TPU_KERNEL_ALLOCATOR:::tpu_kernel::__private::export::KernelAllocator=::tpu_kernel::__private::export::KernelAllocator;";
    for input in [
        quote!("lib", [add]),
        quote!("lib", [add], allocator = mimalloc),
        quote!("lib", [add], allocator = mimalloc, host = [helper]),
    ] {
        let out = library(input);
        assert_contains(&out, declared);
        assert!(!out.contains("compile_error"), "{out}");
    }
    for input in [
        quote!("lib", [add], allocator = system),
        quote!("lib", [add], allocator = system, host = [helper],),
        quote!("lib", [add], host = [helper], allocator = system),
    ] {
        let out = library(input);
        assert!(
            !out.contains("global_allocator") && !out.contains("compile_error"),
            "{out}"
        );
        assert_contains(&out, "pubextern\"C\"fntpu_kernel_abi_version()");
    }
    // Either order of the two keys, the host functions kept.
    assert_contains(
        &library(quote!("lib", [add], allocator = system, host = [helper])),
        ".with_host(::std::vec![::tpu_kernel::__private::export::HostExport::new(\"helper\", helper)])",
    );
}

#[test]
fn export_library_mistakes_name_the_usage() {
    let out = library(quote!("lib", [add], hots = [f]));
    assert!(
        out.contains("compile_error") && out.contains("unknownargument`hots`"),
        "{out}"
    );
    let out = library(quote!("lib", [add], host = f));
    assert!(
        out.contains("compile_error") && out.contains("host=[module::helper]"),
        "{out}"
    );
    let out = library(quote!("lib", [add], allocator = jemalloc));
    assert!(
        out.contains("compile_error")
            && out.contains("unknownallocator`jemalloc`:`mimalloc`")
            && out.contains("or`system`"),
        "{out}"
    );
    let out = library(quote!("lib", [add], allocator = system, allocator = system));
    assert!(
        out.contains("compile_error") && out.contains("`allocator`isgiventwice"),
        "{out}"
    );
    let out = library(quote!("lib", [add], host = [f], host = [g]));
    assert!(
        out.contains("compile_error") && out.contains("`host`isgiventwice"),
        "{out}"
    );
}
