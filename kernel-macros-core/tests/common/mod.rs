//! What a macro expansion is judged by, shared by the fuzz driver (`tests/fuzz/`) and the regression
//! tests (`tests/hostile_input.rs`): where its `compile_error!`s point, and which comparisons it left
//! as Rust's own operators.
//!
//! Spans are compared by byte offsets: with proc_macro2's `span-locations` (a dev feature), tokens
//! lexed from text carry `lo..hi` offsets into one thread-wide source map, so "inside the input"
//! is a range check; `Span::call_site()` is `0..0`, outside every input.

#![allow(dead_code)] // each test binary uses a part

use proc_macro2::{Delimiter, Spacing, Span, TokenStream, TokenTree};

/// A span's `lo..hi` byte offsets in the thread's source map (`0..0` for the call site).
pub fn bytes(span: Span) -> (usize, usize) {
    // The offsets themselves are private to proc_macro2; its `Debug` prints them.
    let text = format!("{span:?}");
    let inner = text
        .strip_prefix("bytes(")
        .and_then(|t| t.strip_suffix(')'))
        .unwrap_or_else(|| {
            panic!("a span-locations span, got {text}: enable proc-macro2's span-locations")
        });
    let (lo, hi) = inner.split_once("..").expect("lo..hi");
    (lo.parse().expect("lo"), hi.parse().expect("hi"))
}

/// The byte range covered by a token stream (`None` when it is empty).
pub fn extent(tokens: &TokenStream) -> Option<(usize, usize)> {
    let mut range: Option<(usize, usize)> = None;
    for tree in tokens.clone() {
        let (lo, hi) = bytes(tree.span());
        if (lo, hi) == (0, 0) {
            continue;
        }
        range = Some(match range {
            None => (lo, hi),
            Some((a, b)) => (a.min(lo), b.max(hi)),
        });
    }
    range
}

/// One `::core::compile_error! { "message" }` of an expansion: its message and the byte ranges of
/// its start and end spans (what rustc underlines runs from the first to the second).
#[derive(Debug, Clone)]
pub struct CompileError {
    pub message: String,
    /// Where it starts, in the lexed text it points into (1-based line, 0-based column).
    pub line: usize,
    pub column: usize,
    pub start: (usize, usize),
    pub end: (usize, usize),
}

/// The top-level `compile_error!`s of an expansion (syn's `into_compile_error` emits them there),
/// and the rest of the expansion.
pub fn split_errors(expansion: &TokenStream) -> (Vec<CompileError>, TokenStream) {
    let trees: Vec<TokenTree> = expansion.clone().into_iter().collect();
    let mut errors = Vec::new();
    let mut rest = Vec::new();
    let mut i = 0;
    while i < trees.len() {
        if let Some(error) = compile_error_at(&trees[i..]) {
            errors.push(error);
            i += 7;
        } else {
            rest.push(trees[i].clone());
            i += 1;
        }
    }
    (errors, rest.into_iter().collect())
}

/// `: : core : : compile_error ! { "message" }` at the start of `trees`.
fn compile_error_at(trees: &[TokenTree]) -> Option<CompileError> {
    let [TokenTree::Punct(colon), _, _, _, TokenTree::Ident(name), TokenTree::Punct(bang), TokenTree::Group(group), ..] =
        trees
    else {
        return None;
    };
    if colon.as_char() != ':' || name != "compile_error" || bang.as_char() != '!' {
        return None;
    }
    if group.delimiter() != Delimiter::Brace {
        return None;
    }
    let message = match group.stream().into_iter().next() {
        Some(TokenTree::Literal(lit)) => lit.to_string(),
        _ => String::new(),
    };
    let start = colon.span().start();
    Some(CompileError {
        message,
        line: start.line,
        column: start.column,
        start: bytes(colon.span()),
        end: bytes(group.span()),
    })
}

/// Whether an error is spanned inside `input` (a byte range): neither at the call site nor
/// anywhere outside the input's tokens.
pub fn inside(error: &CompileError, input: (usize, usize)) -> bool {
    let within = |(lo, hi): (usize, usize)| (lo, hi) != (0, 0) && lo >= input.0 && hi <= input.1;
    within(error.start) && within(error.end)
}

/// The byte offsets of every `==` and `!=` left as Rust's operator in `tokens` (recursively): the
/// comparisons the macro did not rewrite into `TraceEq` calls.
pub fn raw_equalities(tokens: &TokenStream) -> Vec<usize> {
    let mut found = Vec::new();
    collect_raw_equalities(tokens, &mut found);
    found
}

fn collect_raw_equalities(tokens: &TokenStream, found: &mut Vec<usize>) {
    let trees: Vec<TokenTree> = tokens.clone().into_iter().collect();
    for (i, tree) in trees.iter().enumerate() {
        match tree {
            TokenTree::Group(group) => collect_raw_equalities(&group.stream(), found),
            TokenTree::Punct(first) if matches!(first.as_char(), '=' | '!') => {
                if first.spacing() != Spacing::Joint {
                    continue;
                }
                // `==`/`!=`, not the second half of `<=`, `>=`, `===`.
                let after_op = i > 0
                    && matches!(&trees[i - 1], TokenTree::Punct(p) if p.spacing() == Spacing::Joint);
                if after_op {
                    continue;
                }
                if let Some(TokenTree::Punct(second)) = trees.get(i + 1) {
                    if second.as_char() == '=' {
                        found.push(bytes(first.span()).0);
                    }
                }
            }
            _ => {}
        }
    }
}
