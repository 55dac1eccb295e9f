//! The macros under token-level mutants of every kernel in the repository (a deterministic,
//! seeded driver of our own: no cargo-fuzz, no nightly).
//!
//! Each mutant goes through the core's public expansion (`tpu_kernel`, `kernel_fn`, `export`,
//! `export_library`) and is held to:
//! - **no panic** (caught; the mutant is printed);
//! - **every error inside the input**: each `compile_error!` spans the mutant's own tokens, never
//!   the call site (for an attribute, rustc would point at the attribute) nor anything outside;
//! - **accepted means valid Rust**: an expansion without errors parses as a Rust file (an
//!   `#[export]`ed launch fn's body aside: plain Rust the macro passes through for rustc to judge);
//! - **no follow-on errors**: after a single edit inside a kernel body, every `==`/`!=` outside the
//!   statements the edit touched is still rewritten (a raw one would be a type error on a correct
//!   line, as `Scalar == Scalar` is not Rust's `bool`); "touched" is the innermost statement of the
//!   seed holding each token the edit removed, replaced, moved or inserted next to.
//!
//! Seeds are every `#[tpu_kernel]`/`#[kernel_fn]`/`#[export]` item and `export_library!` input of
//! the repository's examples, tests, trybuild cases and kernel libraries (`corpus.rs`); mutants are
//! one to four token-level edits of one (`mutate.rs`).
//!
//! CI runs the default size in debug (`cargo test -p kernel-macros-core --test fuzz`); the long run:
//! `TPU_KERNEL_FUZZ_CASES=100000 cargo test -p kernel-macros-core --release --test fuzz -- --nocapture`
//! (`TPU_KERNEL_FUZZ_SEED` picks another sequence).

mod corpus;
mod mutate;

#[path = "../common/mod.rs"]
mod common;

use std::cell::Cell;
use std::collections::HashSet;
use std::panic::{self, AssertUnwindSafe};
use std::time::Instant;

use proc_macro2::{Delimiter, Group, Span, TokenStream, TokenTree};

use corpus::{Macro, Seed};
use mutate::{Node, Pool, Rng, Site};

/// Mutants in a default run (CI): about ten seconds in debug.
const DEFAULT_CASES: usize = 10_000;
const DEFAULT_SEED: u64 = 0x7e57_0013;
/// Failures printed in full.
const SHOWN: usize = 12;

thread_local! {
    /// Whether this thread is inside an expansion (whose panics the driver catches and counts).
    static EXPANDING: Cell<bool> = const { Cell::new(false) };
}

fn env_number(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(text) => {
            let text = text.trim().replace('_', "");
            match text.strip_prefix("0x") {
                Some(hex) => u64::from_str_radix(hex, 16),
                None => text.parse(),
            }
            .unwrap_or_else(|_| panic!("{name}={text} is not a number"))
        }
        Err(_) => default,
    }
}

/// A seed with what its unmutated expansion left raw (comparisons the macro keeps as Rust's own,
/// e.g. in `const` items).
struct Prepared {
    seed: Seed,
    raw: HashSet<usize>,
    /// The byte range of every statement of the body (nested ones too), when the seed parses.
    statements: Vec<(usize, usize)>,
}

#[derive(Default)]
struct Counts {
    cases: usize,
    skipped: usize,
    panics: usize,
    accepted: usize,
    rejected: usize,
    errors: usize,
    misplaced: usize,
    invalid_accepts: usize,
    follow_ons: usize,
    checked_follow_ons: usize,
}

struct Failure {
    /// What kind of failure, for grouping: the panic message, the misplaced error's message, ...
    class: String,
    what: String,
    seed: String,
    attr: String,
    item: String,
}

#[test]
fn fuzz() {
    let cases = env_number("TPU_KERNEL_FUZZ_CASES", DEFAULT_CASES as u64) as usize;
    let seed = env_number("TPU_KERNEL_FUZZ_SEED", DEFAULT_SEED);
    let started = Instant::now();

    let (seeds, unlexed) = corpus::seeds();
    assert!(
        unlexed.is_empty(),
        "files proc_macro2 cannot lex: {unlexed:?}"
    );
    let count = |kind| seeds.iter().filter(|s| s.kind == kind).count();
    let per_kind = [
        Macro::TpuKernel,
        Macro::KernelFn,
        Macro::Export,
        Macro::ExportLibrary,
    ]
    .map(|k| (k, count(k)));
    assert!(
        per_kind.iter().all(|(_, n)| *n > 0) && seeds.len() > 100,
        "too few seeds: {per_kind:?}"
    );

    // Panics inside an expansion are counted, not printed as they happen (the driver's own are).
    let hook: &'static _ = Box::leak(panic::take_hook());
    panic::set_hook(Box::new(|info| {
        if !EXPANDING.with(Cell::get) {
            hook(info);
        }
    }));

    let mut failures: Vec<Failure> = Vec::new();
    let mut counts = Counts::default();
    let prepared: Vec<Prepared> = seeds
        .into_iter()
        .map(|seed| prepare(seed, &mut failures))
        .collect();
    let pool = Pool::new(
        &prepared
            .iter()
            .flat_map(|p| [p.seed.attr.clone(), p.seed.item.clone()])
            .collect::<Vec<_>>(),
    );
    let mut rng = Rng::new(seed);
    while counts.cases < cases {
        let seed = &prepared[rng.below(prepared.len())];
        match run_mutant(seed, &pool, &mut rng, &mut counts) {
            Ok(()) => {}
            Err(failure) => failures.push(failure),
        }
    }

    println!(
        "macro fuzz: seed {seed:#x}, {} seeds ({}), {} mutants in {:.1?}",
        prepared.len(),
        per_kind
            .iter()
            .map(|(k, n)| format!("{k:?} {n}"))
            .collect::<Vec<_>>()
            .join(", "),
        counts.cases,
        started.elapsed()
    );
    println!(
        "  panics {}, accepted {}, rejected {} ({} errors), misplaced errors {}, accepted but invalid {}, \
         follow-on comparisons {} (of {} single edits in a body checked), no-op edits skipped {}",
        counts.panics,
        counts.accepted,
        counts.rejected,
        counts.errors,
        counts.misplaced,
        counts.invalid_accepts,
        counts.follow_ons,
        counts.checked_follow_ons,
        counts.skipped
    );
    // Each kind of failure: how often, and its first mutant.
    let mut classes: Vec<(&str, usize, &Failure)> = Vec::new();
    for failure in &failures {
        match classes.iter_mut().find(|(c, _, _)| *c == failure.class) {
            Some((_, n, _)) => *n += 1,
            None => classes.push((&failure.class, 1, failure)),
        }
    }
    classes.sort_by_key(|(_, n, _)| std::cmp::Reverse(*n));
    for (class, n, failure) in classes.iter().take(SHOWN) {
        println!(
            "\n--- {n} x {class}\n    {}\n    seed: {}\n    attr: {}\n    item: {}",
            failure.what, failure.seed, failure.attr, failure.item
        );
    }
    assert!(
        failures.is_empty(),
        "{} failures of {} kinds (the first {SHOWN} kinds above)",
        failures.len(),
        classes.len()
    );
}

fn prepare(seed: Seed, failures: &mut Vec<Failure>) -> Prepared {
    let expansion = expand(seed.kind, &seed.attr, &seed.item);
    let raw = match &expansion {
        Ok(tokens) => common::raw_equalities(&common::split_errors(tokens).1)
            .into_iter()
            .collect(),
        Err(_) => HashSet::new(),
    };
    let (mut counts, input) = (Counts::default(), input_range(&seed.attr, &seed.item));
    if let Err((class, what)) = judge(seed.kind, &seed.item, expansion, input, &mut counts) {
        let what = (format!("unmutated {class}"), what);
        failures.push(failure(&seed, what, &seed.attr, &seed.item));
    }
    let statements = statement_ranges(&seed.item);
    Prepared {
        seed,
        raw,
        statements,
    }
}

/// The byte ranges of the statements of a seed's body, at every depth.
fn statement_ranges(item: &TokenStream) -> Vec<(usize, usize)> {
    struct Statements(Vec<(usize, usize)>);
    impl<'ast> syn::visit::Visit<'ast> for Statements {
        fn visit_stmt(&mut self, stmt: &'ast syn::Stmt) {
            self.0
                .extend(common::extent(&quote::ToTokens::to_token_stream(stmt)));
            syn::visit::visit_stmt(self, stmt);
        }
    }
    let mut statements = Statements(Vec::new());
    if let Ok(func) = syn::parse2::<syn::ItemFn>(item.clone()) {
        syn::visit::Visit::visit_block(&mut statements, &func.block);
    }
    statements.0
}

/// The expansion, or the panic's message.
fn expand(kind: Macro, attr: &TokenStream, item: &TokenStream) -> Result<TokenStream, String> {
    let (attr, item) = (attr.clone(), item.clone());
    EXPANDING.with(|e| e.set(true));
    let expansion = panic::catch_unwind(AssertUnwindSafe(|| kind.expand(attr, item)));
    EXPANDING.with(|e| e.set(false));
    expansion.map_err(|payload| {
        payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic".to_string())
    })
}

fn input_range(attr: &TokenStream, item: &TokenStream) -> Option<(usize, usize)> {
    let both: TokenStream = attr.clone().into_iter().chain(item.clone()).collect();
    common::extent(&both)
}

/// The properties every expansion has; counts what it was.
fn judge(
    kind: Macro,
    item: &TokenStream,
    expansion: Result<TokenStream, String>,
    input: Option<(usize, usize)>,
    counts: &mut Counts,
) -> Result<TokenStream, (String, String)> {
    let tokens = expansion.map_err(|message| {
        counts.panics += 1;
        (
            format!("{kind:?} panic: {message}"),
            format!("panic: {message}"),
        )
    })?;
    let (errors, rest) = common::split_errors(&tokens);
    if errors.is_empty() {
        counts.accepted += 1;
        if let Err(error) = syn::parse2::<syn::File>(without_opaque_body(kind, &rest, item)) {
            counts.invalid_accepts += 1;
            return Err((
                format!("{kind:?} accepted, invalid: {error}"),
                format!("accepted, but the expansion is not Rust: {error}"),
            ));
        }
        return Ok(rest);
    }
    counts.rejected += 1;
    counts.errors += errors.len();
    // With no input token at all, the call site is all there is to point at.
    let Some(input) = input else {
        return Ok(rest);
    };
    let misplaced: Vec<_> = errors
        .iter()
        .filter(|e| !common::inside(e, input))
        .collect();
    if !misplaced.is_empty() {
        counts.misplaced += misplaced.len();
        let message: String = misplaced[0].message.chars().take(70).collect();
        return Err((
            format!("{kind:?} misplaced: {message}"),
            format!("{kind:?}: error(s) outside the input {input:?}: {misplaced:?}"),
        ));
    }
    Ok(rest)
}

/// An `#[export]`ed launch fn's body is plain Rust that the macro passes through unread (rustc
/// judges it): in the expansion it is replaced by `{}` before the expansion is parsed.
fn without_opaque_body(kind: Macro, expansion: &TokenStream, item: &TokenStream) -> TokenStream {
    let body = match item.clone().into_iter().last() {
        Some(TokenTree::Group(g)) if kind == Macro::Export && g.delimiter() == Delimiter::Brace => {
            common::bytes(g.span())
        }
        _ => return expansion.clone(),
    };
    expansion
        .clone()
        .into_iter()
        .map(|tree| match tree {
            TokenTree::Group(g)
                if g.delimiter() == Delimiter::Brace && common::bytes(g.span()) == body =>
            {
                let mut empty = Group::new(Delimiter::Brace, TokenStream::new());
                empty.set_span(g.span());
                TokenTree::Group(empty)
            }
            other => other,
        })
        .collect()
}

fn failure(
    seed: &Seed,
    (class, what): (String, String),
    attr: &TokenStream,
    item: &TokenStream,
) -> Failure {
    Failure {
        class,
        what,
        seed: format!(
            "{}:{} ({:?})",
            seed.file
                .strip_prefix(corpus::repo_root())
                .unwrap_or(&seed.file)
                .display(),
            seed.line,
            seed.kind
        ),
        attr: attr.to_string(),
        item: item.to_string(),
    }
}

fn run_mutant(
    prepared: &Prepared,
    pool: &Pool,
    rng: &mut Rng,
    counts: &mut Counts,
) -> Result<(), Failure> {
    let seed = &prepared.seed;
    let mut attr = mutate::tree(seed.attr.clone());
    let mut item = mutate::tree(seed.item.clone());
    let fallback = first_span(&seed.item).unwrap_or_else(Span::call_site);
    let in_attr = seed.kind != Macro::ExportLibrary && rng.chance(15);
    let edits = match rng.below(100) {
        0..=59 => 1,
        60..=84 => 2,
        _ => 3 + rng.below(2),
    };
    let mut sites: Vec<Site> = Vec::new();
    for _ in 0..edits {
        let target = if in_attr { &mut attr } else { &mut item };
        // Some edits do not apply where they land (no literal to change, no group to unwrap).
        if let Some(site) = (0..8).find_map(|_| mutate::mutate(target, pool, rng, fallback)) {
            sites.push(site);
        }
    }
    if sites.is_empty() {
        counts.skipped += 1;
        return Ok(());
    }
    counts.cases += 1;
    let (attr_tokens, item_tokens) = (mutate::tokens(&attr), mutate::tokens(&item));
    let input = input_range(&attr_tokens, &item_tokens);
    let expansion = expand(seed.kind, &attr_tokens, &item_tokens);
    let fail = |what: (String, String)| failure(seed, what, &attr_tokens, &item_tokens);
    let rest = judge(seed.kind, &item_tokens, expansion, input, counts).map_err(fail)?;

    // Follow-on errors: one edit inside the body of a kernel.
    let [site] = sites.as_slice() else {
        return Ok(());
    };
    if in_attr || !seed.kind.rewrites_body() || !edits_body(&item, site) {
        return Ok(());
    }
    counts.checked_follow_ons += 1;
    let region = edited_statements(&prepared.statements, site)
        .unwrap_or_else(|| statement_region(&item, site));
    let stray: Vec<usize> = common::raw_equalities(&rest)
        .into_iter()
        .filter(|at| !prepared.raw.contains(at) && !(region.0..region.1).contains(at))
        .collect();
    if !stray.is_empty() {
        counts.follow_ons += 1;
        return Err(fail((
            format!("{:?} follow-on comparisons", seed.kind),
            format!("comparisons left un-rewritten outside the edited statement {region:?}: at bytes {stray:?}"),
        )));
    }
    Ok(())
}

fn first_span(tokens: &TokenStream) -> Option<Span> {
    tokens.clone().into_iter().next().map(|t| t.span())
}

/// Whether an edit is inside the item's body: the last top-level node, a `{ .. }` group.
fn edits_body(item: &[Node], site: &Site) -> bool {
    let Some(&first) = site.path.first() else {
        return false;
    };
    first + 1 == item.len() && matches!(item[first], Node::Group(Delimiter::Brace, ..))
}

/// The byte range of the statements an edit touched: for each token it removed, replaced, moved or
/// inserted next to, the innermost statement of the seed holding it (`None` if one is in none).
fn edited_statements(statements: &[(usize, usize)], site: &Site) -> Option<(usize, usize)> {
    let mut region: Option<(usize, usize)> = None;
    for span in &site.touched {
        let at = common::bytes(*span).0;
        let (lo, hi) = statements
            .iter()
            .filter(|(lo, hi)| *lo <= at && at < *hi)
            .min_by_key(|(lo, hi)| hi - lo)?;
        region = Some(match region {
            None => (*lo, *hi),
            Some((a, b)) => (a.min(*lo), b.max(*hi)),
        });
    }
    region
}

/// The byte range of the statement an edit is in: in the innermost `{ .. }` around the edit, from
/// the `;` before the edited positions to the `;` after them (so an inserted or deleted `;` covers
/// both statements it joins or splits).
fn statement_region(item: &[Node], site: &Site) -> (usize, usize) {
    // The lists from the root down to the edited one, with the delimiter of each.
    let mut levels: Vec<(Delimiter, &[Node], Span)> =
        vec![(Delimiter::None, item, Span::call_site())];
    for &i in &site.path {
        let (_, list, _) = levels[levels.len() - 1];
        match &list[i] {
            Node::Group(delimiter, span, children) => levels.push((*delimiter, children, *span)),
            Node::Leaf(_) => unreachable!("paths lead through groups"),
        }
    }
    let depth = levels.len() - 1;
    let m = (1..=depth)
        .rev()
        .find(|&m| levels[m].0 == Delimiter::Brace)
        .expect("the body is a brace group");
    let (lo, hi) = if m == depth {
        (site.lo, site.hi)
    } else {
        (site.path[m], site.path[m])
    };
    let (_, list, group_span) = levels[m];
    let is_semi = |n: &Node| matches!(n, Node::Leaf(TokenTree::Punct(p)) if p.as_char() == ';');
    let start = list[..lo.min(list.len())]
        .iter()
        .rposition(is_semi)
        .map_or(0, |i| i + 1);
    let end = list
        .iter()
        .enumerate()
        .skip(hi + 1)
        .find(|(_, n)| is_semi(n))
        .map_or(list.len(), |(i, _)| i + 1);
    let statement = mutate::tokens(&list[start.min(end)..end]);
    common::extent(&statement).unwrap_or_else(|| common::bytes(group_span))
}
