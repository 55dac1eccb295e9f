//! End-to-end check of the generated code against a tiny *eager* mock of
//! `::tpu_kernel::__private` (no tracing: conditions are Rust `bool`s, loops
//! run). It proves that expansions type-check, produce no warnings
//! (`deny(warnings)`), carry variables correctly (same results as plain
//! Rust), and that `#[track_caller]` locations land on the user's tokens.
//! The real runtime lives in `kernel-runtime`; this mock only mirrors the
//! entry points the macros call.

#![deny(warnings)]
#![allow(non_camel_case_types)]
// The kernels below deliberately use `acc = acc + x` (as in the brief's example).
#![allow(clippy::assign_op_pattern)]

// Generated code names `::tpu_kernel::__private`; make that this test crate.
extern crate self as tpu_kernel;

use kernel_macros::{kernel_fn, tpu_kernel};
use std::cell::{Cell, RefCell};
use std::ops::AddAssign;
use std::panic::Location;

thread_local! {
    static CALLS: RefCell<Vec<(&'static str, u32, u32)>> = const { RefCell::new(Vec::new()) };
    static PROGRAM: Cell<i64> = const { Cell::new(0) };
}

fn log(name: &'static str, location: &'static Location<'static>) {
    CALLS.with(|c| {
        c.borrow_mut()
            .push((name, location.line(), location.column()))
    });
}

fn take_calls() -> Vec<(&'static str, u32, u32)> {
    CALLS.with(|c| std::mem::take(&mut *c.borrow_mut()))
}

pub mod __private {
    use super::*;

    pub trait TraceEq<Rhs = Self> {
        #[track_caller]
        fn trace_eq(self, rhs: Rhs) -> bool;
        #[track_caller]
        fn trace_ne(self, rhs: Rhs) -> bool;
    }
    impl<T: PartialEq> TraceEq for T {
        #[track_caller]
        fn trace_eq(self, rhs: T) -> bool {
            log("eq", Location::caller());
            self == rhs
        }
        #[track_caller]
        fn trace_ne(self, rhs: T) -> bool {
            log("ne", Location::caller());
            self != rhs
        }
    }

    pub trait TraceOrd<Rhs = Self> {
        fn trace_lt(self, rhs: Rhs) -> bool;
        fn trace_le(self, rhs: Rhs) -> bool;
        fn trace_gt(self, rhs: Rhs) -> bool;
        fn trace_ge(self, rhs: Rhs) -> bool;
    }
    impl<T: PartialOrd> TraceOrd for T {
        fn trace_lt(self, rhs: T) -> bool {
            self < rhs
        }
        fn trace_le(self, rhs: T) -> bool {
            self <= rhs
        }
        fn trace_gt(self, rhs: T) -> bool {
            self > rhs
        }
        fn trace_ge(self, rhs: T) -> bool {
            self >= rhs
        }
    }

    pub trait TraceLogic<Rhs = Self> {
        fn trace_and(self, rhs: Rhs) -> bool;
        fn trace_or(self, rhs: Rhs) -> bool;
    }
    impl TraceLogic for bool {
        fn trace_and(self, rhs: bool) -> bool {
            self & rhs
        }
        fn trace_or(self, rhs: bool) -> bool {
            self | rhs
        }
    }

    #[track_caller]
    pub fn if_else<V, T>(
        cond: bool,
        vars: V,
        then_branch: impl FnOnce(V) -> (V, T),
        else_branch: impl FnOnce(V) -> (V, T),
    ) -> (V, T) {
        log("if_else", Location::caller());
        if cond {
            then_branch(vars)
        } else {
            else_branch(vars)
        }
    }

    #[track_caller]
    pub fn for_range<I, V>(lo: I, hi: I, vars: V, body: impl FnMut(I, V) -> V) -> V
    where
        I: Copy + PartialOrd + AddAssign + From<u8>,
    {
        log("for_range", Location::caller());
        for_range_step(lo, hi, I::from(1), vars, body)
    }

    pub fn for_range_step<I, V>(
        lo: I,
        hi: I,
        step: I,
        mut vars: V,
        mut body: impl FnMut(I, V) -> V,
    ) -> V
    where
        I: Copy + PartialOrd + AddAssign,
    {
        let mut i = lo;
        while i < hi {
            vars = body(i, vars);
            i += step;
        }
        vars
    }

    #[track_caller]
    pub fn unroll_range(lo: usize, hi: usize) -> std::ops::Range<usize> {
        log("unroll_range", Location::caller());
        lo..hi
    }

    pub fn unroll_range_step(
        lo: usize,
        hi: usize,
        step: usize,
    ) -> std::iter::StepBy<std::ops::Range<usize>> {
        (lo..hi).step_by(step)
    }

    pub fn while_loop<V: Copy>(
        mut vars: V,
        cond: impl Fn(V) -> bool,
        mut body: impl FnMut(V) -> V,
    ) -> V {
        while cond(vars) {
            vars = body(vars);
        }
        vars
    }
}

// ---- a few mock "kernel API" items, just enough for the brief's examples ----

type bf16 = f32;
type Array<T> = T;

#[derive(Clone, Copy)]
struct Ref<T: 'static>(&'static Cell<T>);
type RefMut<T> = Ref<T>;

impl<T: Copy> Ref<T> {
    fn load(self) -> T {
        self.0.get()
    }
    fn store(self, value: T) {
        self.0.set(value)
    }
    fn shape(self) -> [usize; 2] {
        [32, 128]
    }
    fn at<I>(self, _index: I) -> Ref<T> {
        self
    }
}

trait Cast {
    fn cast<U: From<f32>>(self) -> U;
}
impl Cast for f32 {
    fn cast<U: From<f32>>(self) -> U {
        U::from(self)
    }
}

fn leak<T>(value: T) -> Ref<T> {
    Ref(Box::leak(Box::new(Cell::new(value))))
}
fn program_id(_axis: usize) -> i64 {
    PROGRAM.with(Cell::get)
}
fn num_programs(_axis: usize) -> i64 {
    3
}
fn zeros() -> f32 {
    0.0
}
fn dot(a: f32, b: f32) -> f32 {
    a * b
}
fn full(_shape: [usize; 2], value: f32) -> f32 {
    value
}
fn multiple_of(value: usize, _multiple: usize) -> usize {
    value
}
fn ds(start: usize, len: usize) -> (usize, usize) {
    (start, len)
}
fn maximum(a: f32, b: f32) -> f32 {
    a.max(b)
}

// ---- the brief's examples ----

#[tpu_kernel]
fn matmul_kernel(x: Ref<bf16>, y: Ref<bf16>, o: RefMut<bf16>, acc: RefMut<f32>) {
    if program_id(2) == 0 {
        acc.store(zeros());
    }
    acc.store(acc.load() + dot(x.load(), y.load()));
    if program_id(2) == num_programs(2) - 1 {
        o.store(acc.load().cast::<bf16>());
    }
}

#[tpu_kernel]
fn fori_rowsum_kernel(x: Ref<f32>, o: RefMut<f32>) {
    let n_chunks = x.shape()[0] / 8;
    let mut acc = full(o.shape(), 0.0f32);
    for i in 0..n_chunks {
        let start = multiple_of(i * 8, 8);
        acc = acc + x.at((ds(start, 8), ..)).load();
    }
    o.store(acc);
}

#[kernel_fn]
fn relu(x: Array<f32>) -> Array<f32> {
    maximum(x, 0.0)
}

#[test]
fn brief_examples_run() {
    let (x, y, o, acc) = (leak(2.0), leak(3.0), leak(0.0), leak(0.0));
    for pid in 0..3 {
        PROGRAM.with(|p| p.set(pid));
        matmul_kernel(x, y, o, acc);
    }
    assert_eq!(acc.load(), 18.0);
    assert_eq!(o.load(), 18.0);

    let (x, o) = (leak(1.5), leak(0.0));
    fori_rowsum_kernel(x, o);
    assert_eq!(o.load(), 6.0); // 32 / 8 chunks of 1.5

    assert_eq!(relu(-1.0), 0.0);
    assert_eq!(relu(2.0), 2.0);
}

// ---- carried variables: same results as plain Rust ----

#[kernel_fn]
fn collatz_steps(n: i64) -> i64 {
    let mut n = n;
    let mut steps = 0;
    while n != 1 {
        if n % 2 == 0 {
            n = n / 2;
        } else {
            n = 3 * n + 1;
        }
        steps += 1;
    }
    steps
}

fn collatz_steps_plain(mut n: i64) -> i64 {
    let mut steps = 0;
    while n != 1 {
        n = if n % 2 == 0 { n / 2 } else { 3 * n + 1 };
        steps += 1;
    }
    steps
}

#[kernel_fn]
fn shadowing(k: i64) -> (i64, i64, i64) {
    let mut a = 1;
    let mut b = 10;
    let mut c = 100;
    if k > 0 {
        a = a + k; // carried
        let mut b = 0; // shadows the outer `b` from here on
        b += k; // local, not carried
        c = c + b; // carried
    } else if k < -5 {
        b -= 1;
    } else {
        // nested control flow still carries `a`
        for i in 0..3 {
            if i == 1 {
                a = a * 7;
            }
        }
    }
    (a, b, c)
}

#[kernel_fn]
fn loop_shadowing(n: i64) -> i64 {
    let mut total = 0;
    for i in 0..n {
        total += i;
        // After this `let`, `total` refers to a new local: the returned carried
        // value must still be the outer one.
        let total = 1000;
        let _ = total;
    }
    total
}

#[kernel_fn]
fn stepped_and_values(n: i64, flag: bool) -> i64 {
    let mut sum = 0;
    for i in (0..n).step_by(3) {
        sum = sum + i;
    }
    let bonus = if flag && sum > 3 || n == 0 { 1 } else { 2 };
    let mut unused_by_cond = 0;
    let mut i = 0;
    while (i < n) {
        unused_by_cond = unused_by_cond + i;
        i += 1;
    }
    for _ in 0..2 {}
    sum * 10 + bonus + unused_by_cond * 1000
}

#[test]
fn carried_variables_behave_like_rust() {
    for n in 1..30 {
        assert_eq!(collatz_steps(n), collatz_steps_plain(n), "n = {n}");
    }
    assert_eq!(shadowing(2), (3, 10, 102));
    assert_eq!(shadowing(-6), (1, 9, 100));
    assert_eq!(shadowing(-1), (7, 10, 100));
    assert_eq!(loop_shadowing(5), 10);
    // 0 + 3 + 6 = 9; bonus 1; 0+1+..+6 = 21
    assert_eq!(stepped_and_values(7, true), 90 + 1 + 21_000);
    assert_eq!(stepped_and_values(0, false), 1);
    assert_eq!(stepped_and_values(2, false), 2 + 1000);
}

// ---- empty statements (`a;;`) are accepted, as Rust accepts them (issue 13) ----

// rustc's own lint for the extra `;` still applies to the user's code, as it would without the macro.
#[allow(redundant_semicolons)]
#[tpu_kernel]
fn empty_statements_kernel(x: Ref<f32>, o: RefMut<f32>) {
    o.store(x.load());
    for _ in 0..2 {
        o.store(o.load() + x.load());
    }
}

#[test]
fn empty_statements_are_accepted() {
    let (x, o) = (leak(1.5), leak(0.0));
    empty_statements_kernel(x, o);
    assert_eq!(o.load(), 4.5);
}

// ---- unrolled loops stay Rust loops: outer variables assigned as in Rust, nothing carried ----

#[kernel_fn]
fn unrolled(n: usize) -> (usize, i64) {
    let mut sum = 0;
    let mut traced = 0i64;
    for p in unroll(0..n) {
        sum += p;
        // A traced `if` inside an unrolled body still carries what it assigns.
        if p % 2 == 0 {
            traced = traced + 1;
        }
    }
    for p in unroll((1..n).step_by(3)) {
        sum += 100 * p;
    }
    (sum, traced)
}

#[test]
fn unrolled_loops_run_their_body_per_value() {
    take_calls();
    // 0+1+2+3+4 = 10; 100 * (1 + 4) = 500; p even: 0, 2, 4
    assert_eq!(unrolled(5), (510, 3));
    assert!(take_calls()
        .iter()
        .any(|(name, _, _)| *name == "unroll_range"));
}

// ---- #[track_caller] locations point at the user's tokens ----

const LOCATION_LINE: u32 = line!();
#[kernel_fn]
fn located(a: i64) -> i64 {
    if a == 3 {
        1
    } else {
        2
    }
}

#[test]
fn locations_point_at_user_tokens() {
    take_calls();
    assert_eq!(located(3), 1);
    let source = include_str!("mock_runtime.rs");
    let line_of = |offset: u32| source.lines().nth((LOCATION_LINE + offset - 1) as usize);
    let if_line = line_of(3).expect("source line");
    let if_col = if_line.find("if").expect("`if`") as u32 + 1;
    let eq_col = if_line.find("==").expect("`==`") as u32 + 1;
    assert_eq!(
        take_calls(),
        vec![
            ("eq", LOCATION_LINE + 3, eq_col),
            ("if_else", LOCATION_LINE + 3, if_col),
        ]
    );
}
