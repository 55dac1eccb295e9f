//! Statement-level recovery: a body with a syntax error is still checked and rewritten around the
//! broken statement.
//!
//! Without it, one typo anywhere in a kernel made the whole function unparseable, so it was
//! emitted untouched: every correct comparison of the body stayed Rust's `==` on `Scalar`s, a type
//! error on a correct line. When everything but the body parses, the body is recovered:
//! - it is split after each top-level `;` into chunks (a `;` always ends a statement, and a chunk
//!   ending in one parses alone as it does in sequence); most chunks parse;
//! - a chunk that does not is first repaired inside: each `{ .. }` group whose inside does not
//!   parse is recovered the same way, so a typo deep in a loop leaves the loop rewritten;
//! - if it still does not parse, it is cut where a statement may start (after a `{ .. }`, before
//!   a keyword or a name following a complete operand) and taken greedily: the longest run of
//!   pieces that parses; else the longest that parses with a `;` after it (a missing `;`: the
//!   `;` is added, the statement kept); else one piece is broken.
//!
//! A broken piece becomes a placeholder block `{ __tpu_kernel_broken_statement_N }` that `check`
//! and `generate` see as an empty block; after generation it is replaced by the piece's own tokens,
//! so rustc sees (and also reports) the user's code. Each chunk reports syn's first error in it.

use proc_macro2::{
    Delimiter, Group, Ident, Punct, Spacing, TokenStream as TokenStream2, TokenTree,
};
use syn::{Block, Expr, Item, ItemFn, Stmt};

use crate::syntax::{
    parse_whole, parse_whole_with, split_body, take_inner_attributes, with_empty_body,
};

/// A placeholder's name is this with the broken piece's index appended.
const PLACEHOLDER: &str = "__tpu_kernel_broken_statement_";

/// Keywords that start a statement (a piece may begin there).
const STATEMENT_KEYWORDS: &[&str] = &[
    "let", "if", "for", "while", "loop", "match", "return", "const", "use", "static", "fn",
];

/// What recovery set aside: the broken pieces, and syn's errors.
#[derive(Default)]
pub(crate) struct Recovered {
    broken: Vec<TokenStream2>,
    pub(crate) errors: Vec<syn::Error>,
}

/// `item` does not parse as an item; if its signature does and it is a function, the function
/// with its body recovered (`original` is reported if recovery finds nothing wrong).
pub(crate) fn recover_fn(
    item: &TokenStream2,
    original: &syn::Error,
) -> Option<(ItemFn, Recovered)> {
    let (head, body) = split_body(item)?;
    let Item::Fn(mut func) = parse_whole::<Item>(with_empty_body(&head, &body)).ok()? else {
        return None;
    };
    let mut trees: Vec<TokenTree> = body.stream().into_iter().collect();
    func.attrs.extend(take_inner_attributes(&mut trees));
    let mut recovered = Recovered::default();
    let stmts = recover_stmts(&trees, &mut recovered);
    let mut block = Group::new(Delimiter::Brace, stmts);
    block.set_span(body.span());
    func.block = Box::new(syn::parse2::<Block>(TokenTree::Group(block).into()).ok()?);
    if recovered.errors.is_empty() {
        recovered.errors.push(original.clone());
    }
    Some((func, recovered))
}

impl Recovered {
    /// The generated tokens with every placeholder replaced by its broken piece.
    pub(crate) fn restore(&self, tokens: TokenStream2) -> TokenStream2 {
        if self.broken.is_empty() {
            return tokens;
        }
        let mut out = TokenStream2::new();
        for tree in tokens {
            match tree {
                TokenTree::Group(group) => match self.piece_of(&group) {
                    Some(piece) => out.extend(self.restore(piece.clone())),
                    None if self.mentions_placeholder(&group.stream()) => {
                        let mut restored =
                            Group::new(group.delimiter(), self.restore(group.stream()));
                        restored.set_span(group.span());
                        out.extend([TokenTree::Group(restored)]);
                    }
                    None => out.extend([TokenTree::Group(group)]),
                },
                other => out.extend([other]),
            }
        }
        out
    }

    /// The broken piece a placeholder block `{ __tpu_kernel_broken_statement_N }` stands for.
    fn piece_of(&self, group: &Group) -> Option<&TokenStream2> {
        if group.delimiter() != Delimiter::Brace {
            return None;
        }
        let mut inside = group.stream().into_iter();
        match (inside.next(), inside.next()) {
            (Some(TokenTree::Ident(ident)), None) => {
                let index: usize = ident.to_string().strip_prefix(PLACEHOLDER)?.parse().ok()?;
                self.broken.get(index)
            }
            _ => None,
        }
    }

    fn mentions_placeholder(&self, tokens: &TokenStream2) -> bool {
        tokens.clone().into_iter().any(|tree| match tree {
            TokenTree::Group(group) => {
                self.piece_of(&group).is_some() || self.mentions_placeholder(&group.stream())
            }
            _ => false,
        })
    }

    /// A placeholder block for a broken piece.
    fn set_aside(&mut self, piece: &[TokenTree]) -> TokenTree {
        let name = Ident::new(
            &format!("{PLACEHOLDER}{}", self.broken.len()),
            piece[0].span(),
        );
        self.broken.push(piece.iter().cloned().collect());
        let mut block = Group::new(Delimiter::Brace, TokenTree::Ident(name).into());
        block.set_span(piece[0].span());
        TokenTree::Group(block)
    }
}

fn stmts(tokens: TokenStream2) -> syn::Result<Vec<Stmt>> {
    parse_whole_with(Block::parse_within, tokens)
}

/// Whether `trees` parse as statements; when `followed`, more statements come after them, so the
/// last one must not be an expression that needs a `;` (`a + b` then `c` is not `a + b; c`).
fn parses(trees: &[TokenTree], followed: bool) -> bool {
    match stmts(trees.iter().cloned().collect()) {
        Err(_) => false,
        Ok(stmts) => !followed || !stmts.last().is_some_and(needs_semicolon),
    }
}

fn needs_semicolon(stmt: &Stmt) -> bool {
    match stmt {
        Stmt::Expr(expr, None) => !matches!(
            expr,
            Expr::If(_)
                | Expr::ForLoop(_)
                | Expr::While(_)
                | Expr::Loop(_)
                | Expr::Block(_)
                | Expr::Match(_)
                | Expr::Unsafe(_)
                | Expr::TryBlock(_)
                | Expr::Const(_)
        ),
        Stmt::Macro(mac) => {
            mac.semi_token.is_none() && !matches!(mac.mac.delimiter, syn::MacroDelimiter::Brace(_))
        }
        Stmt::Local(_) | Stmt::Item(_) | Stmt::Expr(_, Some(_)) => false,
    }
}

/// The statements of a block's inside, with what does not parse repaired or set aside.
fn recover_stmts(trees: &[TokenTree], recovered: &mut Recovered) -> TokenStream2 {
    let mut out = TokenStream2::new();
    for chunk in chunks(trees) {
        if parses(chunk, false) {
            out.extend(chunk.iter().cloned());
            continue;
        }
        let (broken_before, errors_before) = (recovered.broken.len(), recovered.errors.len());
        let repaired = repair_groups(chunk, recovered);
        if parses(&repaired, false) {
            out.extend(repaired);
            continue;
        }
        // Broken at its own level. With mistakes inside groups too, their repairs are kept;
        // otherwise the chunk is cut as written (syn's error then points at its first mistake).
        let pieces = if recovered.errors.len() > errors_before {
            repaired
        } else {
            recovered.broken.truncate(broken_before);
            chunk.to_vec()
        };
        let error = stmts(pieces.iter().cloned().collect()).err();
        out.extend(recover_pieces(&pieces, error, recovered));
    }
    out
}

/// A broken chunk's pieces, taken greedily (see the module docs); `error` is reported once.
fn recover_pieces(
    chunk: &[TokenTree],
    error: Option<syn::Error>,
    recovered: &mut Recovered,
) -> TokenStream2 {
    let starts = piece_starts(chunk);
    let end = chunk.len();
    let index_of = |to: usize| starts.iter().position(|&s| s == to).unwrap_or(starts.len());
    let mut out = TokenStream2::new();
    let mut i = 0;
    while i < starts.len() {
        let from = starts[i];
        let ends: Vec<usize> = starts[i + 1..].iter().copied().chain([end]).rev().collect();
        // The longest run of pieces that parses.
        if let Some(&to) = ends.iter().find(|&&to| parses(&chunk[from..to], to < end)) {
            out.extend(chunk[from..to].iter().cloned());
            i = index_of(to);
            continue;
        }
        // The longest that parses with a `;` after it: the `;` was missing.
        let with_semi = |to: usize| {
            let mut semi = Punct::new(';', Spacing::Alone);
            semi.set_span(chunk[to - 1].span());
            let mut piece = chunk[from..to].to_vec();
            piece.push(TokenTree::Punct(semi));
            piece
        };
        if let Some(&to) = ends
            .iter()
            .find(|&&to| to < end && parses(&with_semi(to), true))
        {
            out.extend(with_semi(to));
            i = index_of(to);
            continue;
        }
        // This piece is broken.
        let to = starts.get(i + 1).copied().unwrap_or(end);
        out.extend([recovered.set_aside(&chunk[from..to])]);
        i += 1;
    }
    recovered.errors.extend(error.or_else(|| {
        let first = chunk.first()?;
        Some(syn::Error::new(first.span(), "expected a statement"))
    }));
    out
}

/// Where pieces of a broken chunk may start: at 0, after a `{ .. }`, before a statement keyword,
/// and before a name or literal that follows a complete operand (`2.0 if`, `a b`).
fn piece_starts(chunk: &[TokenTree]) -> Vec<usize> {
    let mut starts = vec![0];
    for at in 1..chunk.len() {
        let after_block =
            matches!(&chunk[at - 1], TokenTree::Group(g) if g.delimiter() == Delimiter::Brace);
        let keyword =
            matches!(&chunk[at], TokenTree::Ident(i) if STATEMENT_KEYWORDS.iter().any(|k| i == k));
        let operand_follows_operand =
            matches!(&chunk[at], TokenTree::Ident(_) | TokenTree::Literal(_))
                && matches!(
                    &chunk[at - 1],
                    TokenTree::Ident(_) | TokenTree::Literal(_) | TokenTree::Group(_)
                );
        if after_block || keyword || operand_follows_operand {
            starts.push(at);
        }
    }
    starts
}

/// `trees` split after each `;`; the last chunk may have none. No chunk is empty.
fn chunks(trees: &[TokenTree]) -> impl Iterator<Item = &[TokenTree]> {
    trees
        .split_inclusive(|t| matches!(t, TokenTree::Punct(p) if p.as_char() == ';'))
        .filter(|chunk| !chunk.is_empty())
}

/// `trees` with each `{ .. }` group whose inside does not parse as statements recovered (in any
/// group, e.g. a closure's body inside a call's parentheses).
fn repair_groups(trees: &[TokenTree], recovered: &mut Recovered) -> Vec<TokenTree> {
    trees
        .iter()
        .map(|tree| match tree {
            TokenTree::Group(group) => repair_group(group, recovered)
                .map(TokenTree::Group)
                .unwrap_or_else(|| tree.clone()),
            other => other.clone(),
        })
        .collect()
}

/// The group repaired, or `None` when nothing in it needs repair (a rebuilt group has one span
/// for both delimiters, so untouched groups are kept).
fn repair_group(group: &Group, recovered: &mut Recovered) -> Option<Group> {
    let inner: Vec<TokenTree> = group.stream().into_iter().collect();
    let repaired: TokenStream2 = if group.delimiter() == Delimiter::Brace {
        if parses(&inner, false) {
            return None;
        }
        recover_stmts(&inner, recovered)
    } else {
        let nested: Vec<(usize, Group)> = inner
            .iter()
            .enumerate()
            .filter_map(|(i, tree)| match tree {
                TokenTree::Group(g) => repair_group(g, recovered).map(|g| (i, g)),
                _ => None,
            })
            .collect();
        if nested.is_empty() {
            return None;
        }
        let mut trees = inner;
        for (i, g) in nested {
            trees[i] = TokenTree::Group(g);
        }
        trees.into_iter().collect()
    };
    let mut out = Group::new(group.delimiter(), repaired);
    out.set_span(group.span());
    Some(out)
}
