//! Small syntactic helpers shared by `check`, `body` and `generate`.

use proc_macro2::{Delimiter, Group, Span, TokenStream as TokenStream2, TokenTree};
use quote::ToTokens;
use syn::parse::{Parse, ParseStream, Parser};
use syn::visit::{self, Visit};
use syn::{Attribute, Block, Expr, Item, Pat, RangeLimits};

/// Message for a `for` loop whose iterable is not `lo..hi`.
pub(crate) const MSG_FOR_RANGE: &str = "a traced `for` loop iterates over a range `lo..hi` (lowered to scf.for), e.g. `for i in 0..n` or `for i in (0..n).step_by(2)`";
/// Message for `lo..=hi` as a loop range.
pub(crate) const MSG_INCLUSIVE: &str =
    "inclusive ranges cannot be traced; use a half-open range `lo..hi` (e.g. `lo..hi + 1`)";

/// Parses all of `tokens` as a `T`, like `syn::parse2`, except that running out of tokens is
/// reported at the last token instead of at the call site (for an attribute, rustc would point at
/// the attribute, not at what is missing; for no tokens at all there is nothing else to point at).
pub(crate) fn parse_whole<T: Parse>(tokens: TokenStream2) -> syn::Result<T> {
    parse_whole_with(T::parse, tokens)
}

/// [`parse_whole`] with a parser function.
pub(crate) fn parse_whole_with<T>(
    parser: impl FnOnce(ParseStream) -> syn::Result<T>,
    tokens: TokenStream2,
) -> syn::Result<T> {
    let last = tokens.clone().into_iter().last().map(|t| t.span());
    // Inside a group, syn reports the end of input at the group's closing span: the last token.
    let mut group = Group::new(Delimiter::Parenthesis, tokens);
    group.set_span(last.unwrap_or_else(Span::call_site));
    let wrapped = TokenStream2::from(TokenTree::Group(group));
    let whole = |input: ParseStream| {
        let content;
        syn::parenthesized!(content in input);
        let value = parser(&content)?;
        if !content.is_empty() {
            return Err(content.error("unexpected token"));
        }
        Ok(value)
    };
    whole.parse2(wrapped)
}

/// Splits an item into everything before its body and the body, when it ends with a `{ .. }`.
pub(crate) fn split_body(item: &TokenStream2) -> Option<(TokenStream2, Group)> {
    let mut trees: Vec<TokenTree> = item.clone().into_iter().collect();
    match trees.pop() {
        Some(TokenTree::Group(body)) if body.delimiter() == Delimiter::Brace => {
            Some((trees.into_iter().collect(), body))
        }
        _ => None,
    }
}

/// `head` followed by an empty body `{}` (spanned at `body`), for parsing a signature alone.
pub(crate) fn with_empty_body(head: &TokenStream2, body: &Group) -> TokenStream2 {
    let mut empty = Group::new(Delimiter::Brace, TokenStream2::new());
    empty.set_span(body.span());
    let mut tokens = head.clone();
    tokens.extend([TokenTree::Group(empty)]);
    tokens
}

/// Leading `#![..]` attributes of a body, which are not statements.
pub(crate) fn take_inner_attributes(trees: &mut Vec<TokenTree>) -> Vec<Attribute> {
    let mut attributes = Vec::new();
    while let [TokenTree::Punct(hash), TokenTree::Punct(bang), TokenTree::Group(group), ..] =
        trees.as_slice()
    {
        if hash.as_char() != '#' || bang.as_char() != '!' || group.delimiter() != Delimiter::Bracket
        {
            break;
        }
        let tokens: TokenStream2 = trees[..3].iter().cloned().collect();
        match parse_whole_with(Attribute::parse_inner, tokens) {
            Ok(parsed) => attributes.extend(parsed),
            Err(_) => break,
        }
        trees.drain(..3);
    }
    attributes
}

/// Strips any number of parentheses around an expression.
pub(crate) fn unparen(mut expr: &Expr) -> &Expr {
    while let Expr::Paren(paren) = expr {
        expr = &paren.expr;
    }
    expr
}

/// The parts of a traced `for` loop iterable: `lo..hi` or `(lo..hi).step_by(step)`.
pub(crate) struct RangeParts<'a> {
    pub(crate) lo: &'a Expr,
    pub(crate) hi: &'a Expr,
    pub(crate) step: Option<&'a Expr>,
}

/// Splits a `for` loop iterable into its range parts, or explains why it
/// cannot be traced (the error is spanned at the offending tokens).
pub(crate) fn range_parts(iter: &Expr) -> syn::Result<RangeParts<'_>> {
    match unparen(iter) {
        Expr::MethodCall(call) if call.method == "step_by" => {
            let (lo, hi) = half_open(unparen(&call.receiver), iter)?;
            if call.args.len() != 1 {
                return Err(syn::Error::new_spanned(
                    call,
                    "`step_by` takes exactly one argument: `(lo..hi).step_by(step)`",
                ));
            }
            Ok(RangeParts {
                lo,
                hi,
                step: call.args.first(),
            })
        }
        other => {
            let (lo, hi) = half_open(other, iter)?;
            Ok(RangeParts { lo, hi, step: None })
        }
    }
}

/// The range of an unrolled loop, `for p in unroll(range)`: the argument of a call of a function named
/// `unroll` (a path ending in it, e.g. `tpu_kernel::prelude::unroll`) with one argument.
pub(crate) fn unroll_arg(iter: &Expr) -> Option<&Expr> {
    match unparen(iter) {
        Expr::Call(call) if call.args.len() == 1 => match unparen(&call.func) {
            Expr::Path(path) if path.qself.is_none() => {
                let last = path.path.segments.last()?;
                (last.ident == "unroll" && last.arguments.is_none()).then(|| &call.args[0])
            }
            _ => None,
        },
        _ => None,
    }
}

/// `lo..hi` with both ends; `whole` is what a generic error is spanned at.
fn half_open<'a>(expr: &'a Expr, whole: &Expr) -> syn::Result<(&'a Expr, &'a Expr)> {
    match expr {
        Expr::Range(range) => {
            if let RangeLimits::Closed(dots) = &range.limits {
                return Err(syn::Error::new_spanned(dots, MSG_INCLUSIVE));
            }
            match (&range.start, &range.end) {
                (Some(lo), Some(hi)) => Ok((unparen(lo), unparen(hi))),
                _ => Err(syn::Error::new_spanned(
                    range,
                    format!("{MSG_FOR_RANGE}; both ends of the range are required"),
                )),
            }
        }
        _ => Err(syn::Error::new_spanned(whole, MSG_FOR_RANGE)),
    }
}

/// Whether a traced `for` loop can bind this pattern (a name or `_`).
pub(crate) fn is_loop_binding(pat: &Pat) -> bool {
    match pat {
        Pat::Ident(ident) => ident.by_ref.is_none() && ident.subpat.is_none(),
        Pat::Wild(_) => true,
        _ => false,
    }
}

/// Whether a block contains something that leaves the surrounding code early
/// (`return`, `break`, `continue`, `?`, `.await`, `yield`) outside of nested
/// closures, async blocks and items. Such blocks must not be moved into the
/// closures the control-flow rewrites generate (only relevant for the
/// best-effort output emitted next to errors; valid kernels have none).
pub(crate) fn contains_escape(block: &Block) -> bool {
    let mut finder = EscapeFinder { found: false };
    finder.visit_block(block);
    finder.found
}

/// [`contains_escape`] for an expression (e.g. an `else` branch).
pub(crate) fn expr_contains_escape(expr: &Expr) -> bool {
    let mut finder = EscapeFinder { found: false };
    finder.visit_expr(expr);
    finder.found
}

struct EscapeFinder {
    found: bool,
}

impl<'ast> Visit<'ast> for EscapeFinder {
    fn visit_expr(&mut self, expr: &'ast Expr) {
        match expr {
            Expr::Return(_)
            | Expr::Break(_)
            | Expr::Continue(_)
            | Expr::Try(_)
            | Expr::Await(_)
            | Expr::Yield(_) => self.found = true,
            Expr::Closure(_) | Expr::Async(_) | Expr::Const(_) => {}
            _ => visit::visit_expr(self, expr),
        }
    }

    fn visit_item(&mut self, _: &'ast Item) {}
}

/// The tokens identifying an item (`fn name`, `struct Name`, ...), for spans.
pub(crate) fn item_head(item: &Item) -> TokenStream2 {
    fn join(parts: &[&dyn ToTokens]) -> TokenStream2 {
        let mut tokens = TokenStream2::new();
        for part in parts {
            part.to_tokens(&mut tokens);
        }
        tokens
    }
    match item {
        Item::Const(i) => join(&[&i.const_token, &i.ident]),
        Item::Enum(i) => join(&[&i.enum_token, &i.ident]),
        Item::ExternCrate(i) => join(&[&i.extern_token, &i.crate_token, &i.ident]),
        Item::Fn(i) => join(&[&i.sig.fn_token, &i.sig.ident]),
        Item::ForeignMod(i) => i.abi.to_token_stream(),
        Item::Impl(i) => join(&[&i.impl_token, &i.self_ty]),
        Item::Macro(i) => i.mac.path.to_token_stream(),
        Item::Mod(i) => join(&[&i.mod_token, &i.ident]),
        Item::Static(i) => join(&[&i.static_token, &i.mutability, &i.ident]),
        Item::Struct(i) => join(&[&i.struct_token, &i.ident]),
        Item::Trait(i) => join(&[&i.trait_token, &i.ident]),
        Item::TraitAlias(i) => join(&[&i.trait_token, &i.ident]),
        Item::Type(i) => join(&[&i.type_token, &i.ident]),
        Item::Union(i) => join(&[&i.union_token, &i.ident]),
        Item::Use(i) => i.use_token.to_token_stream(),
        other => other.to_token_stream(),
    }
}
