//! Token-level mutants: a seed's tokens as an editable tree, and the edits a hostile (or hurried)
//! user makes — a token or group deleted, duplicated, swapped, replaced, punctuation or a keyword
//! inserted, a literal changed, a group's delimiter changed, emptied, unwrapped or added, a subtree
//! copied elsewhere.
//!
//! Every token a mutant gains takes the span of a neighbour, so all of a mutant's tokens stay
//! located inside its seed; each edit reports where it happened, for the follow-on check.

use std::str::FromStr;

use proc_macro2::{Delimiter, Group, Ident, Literal, Punct, Spacing, Span, TokenStream, TokenTree};

/// SplitMix64: small, fast, and the same sequence on every machine for a seed.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    pub fn chance(&mut self, percent: u64) -> bool {
        self.next_u64() % 100 < percent
    }

    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

/// A token tree whose groups can be edited in place.
#[derive(Clone)]
pub enum Node {
    Leaf(TokenTree),
    Group(Delimiter, Span, Vec<Node>),
}

impl Node {
    fn span(&self) -> Span {
        match self {
            Node::Leaf(tree) => tree.span(),
            Node::Group(_, span, _) => *span,
        }
    }

    /// The same tokens, every span replaced by `span`.
    fn respanned(&self, span: Span) -> Node {
        match self {
            Node::Leaf(tree) => {
                let mut tree = tree.clone();
                tree.set_span(span);
                Node::Leaf(tree)
            }
            Node::Group(delimiter, _, children) => Node::Group(
                *delimiter,
                span,
                children.iter().map(|c| c.respanned(span)).collect(),
            ),
        }
    }
}

pub fn tree(tokens: TokenStream) -> Vec<Node> {
    tokens
        .into_iter()
        .map(|tree| match tree {
            TokenTree::Group(group) => {
                Node::Group(group.delimiter(), group.span(), self::tree(group.stream()))
            }
            leaf => Node::Leaf(leaf),
        })
        .collect()
}

pub fn tokens(nodes: &[Node]) -> TokenStream {
    nodes
        .iter()
        .map(|node| match node {
            Node::Leaf(tree) => tree.clone(),
            Node::Group(delimiter, span, children) => {
                let mut group = Group::new(*delimiter, tokens(children));
                group.set_span(*span);
                TokenTree::Group(group)
            }
        })
        .collect()
}

/// Where an edit happened: the list (a path of group indices from the root), the positions
/// `lo..=hi` in it that the edit touched, in the mutated tree, and the spans of the seed's tokens
/// it removed, replaced, moved or inserted next to.
#[derive(Clone, Debug)]
pub struct Site {
    pub path: Vec<usize>,
    pub lo: usize,
    pub hi: usize,
    pub touched: Vec<Span>,
}

/// What mutants are made of, gathered from the seeds once.
pub struct Pool {
    idents: Vec<String>,
    literals: Vec<Literal>,
}

/// Rust's keywords and a few reserved or special names.
const KEYWORDS: &[&str] = &[
    "let",
    "mut",
    "if",
    "else",
    "for",
    "in",
    "while",
    "loop",
    "match",
    "return",
    "break",
    "continue",
    "fn",
    "move",
    "async",
    "await",
    "unsafe",
    "const",
    "static",
    "struct",
    "enum",
    "impl",
    "trait",
    "use",
    "mod",
    "ref",
    "as",
    "self",
    "Self",
    "crate",
    "super",
    "where",
    "dyn",
    "type",
    "true",
    "false",
    "_",
    "pub",
    "extern",
    "yield",
    "try",
    "box",
    "macro_rules",
    "union",
    "r#fn",
    "r#match",
    "gen",
    "become",
    "do",
];

/// Punctuation, alone or as the multi-character operators a lexer joins.
const PUNCTS: &[&str] = &[
    ";", ",", ".", ":", "::", "=", "==", "!=", "<", ">", "<=", ">=", "+", "-", "*", "/", "%", "&",
    "&&", "|", "||", "!", "?", "#", "@", "$", "~", "^", "..", "..=", "...", "->", "=>", "+=", "-=",
    "*=", "<<", ">>", "'",
];

/// Literals: edge values of every kind, written as a user would.
const LITERALS: &str = r#"0 1 2 7 8 127 128 255 256 1024 65535 4294967296 2147483648
    18446744073709551615 340282366920938463463374607431768211455 0x7fff_ffff 0b1 0o7 1u8 300u8
    0usize 1_000_000i64 1i128 1.0 0.5 1e308 1e400 1.5e-45f32 1f64 0.0f32 "" "x" "\u{1F600}" r"raw"
    'a' '\n' b'a' b"x" c"c" 1__2 0xffffffffffffffffffffffffffffffffff"#;

impl Pool {
    pub fn new(seeds: &[TokenStream]) -> Pool {
        let mut idents: Vec<String> = KEYWORDS.iter().map(|k| k.to_string()).collect();
        for seed in seeds {
            collect_idents(seed.clone(), &mut idents);
        }
        idents.sort();
        idents.dedup();
        let mut literals: Vec<Literal> = TokenStream::from_str(LITERALS)
            .expect("the literal pool lexes")
            .into_iter()
            .filter_map(|t| match t {
                TokenTree::Literal(lit) => Some(lit),
                _ => None,
            })
            .collect();
        literals.extend([
            Literal::i64_unsuffixed(-1),
            Literal::i32_suffixed(i32::MIN),
            Literal::f64_unsuffixed(-0.0),
            Literal::f32_suffixed(f32::MIN_POSITIVE),
            Literal::string(""),
        ]);
        Pool { idents, literals }
    }

    fn ident(&self, rng: &mut Rng, span: Span) -> TokenTree {
        let name = rng.pick(&self.idents);
        TokenTree::Ident(match name.strip_prefix("r#") {
            Some(raw) => Ident::new_raw(raw, span),
            None => Ident::new(name, span),
        })
    }

    fn literal(&self, rng: &mut Rng, span: Span) -> TokenTree {
        let mut lit = rng.pick(&self.literals).clone();
        lit.set_span(span);
        TokenTree::Literal(lit)
    }
}

fn collect_idents(tokens: TokenStream, out: &mut Vec<String>) {
    for tree in tokens {
        match tree {
            TokenTree::Ident(ident) => out.push(ident.to_string()),
            TokenTree::Group(group) => collect_idents(group.stream(), out),
            _ => {}
        }
    }
}

/// `==` as tokens: every character but the last joint to the next.
fn punct_nodes(text: &str, span: Span) -> Vec<Node> {
    let chars: Vec<char> = text.chars().collect();
    chars
        .iter()
        .enumerate()
        .map(|(i, &c)| {
            let spacing = if i + 1 < chars.len() || c == '\'' {
                Spacing::Joint
            } else {
                Spacing::Alone
            };
            let mut punct = Punct::new(c, spacing);
            punct.set_span(span);
            Node::Leaf(TokenTree::Punct(punct))
        })
        .collect()
}

/// Every list of the tree (the root and each group's children) by path.
fn lists(nodes: &[Node], path: &mut Vec<usize>, out: &mut Vec<(Vec<usize>, usize)>) {
    out.push((path.clone(), nodes.len()));
    for (i, node) in nodes.iter().enumerate() {
        if let Node::Group(_, _, children) = node {
            path.push(i);
            lists(children, path, out);
            path.pop();
        }
    }
}

fn list_mut<'a>(nodes: &'a mut Vec<Node>, path: &[usize]) -> &'a mut Vec<Node> {
    match path.split_first() {
        None => nodes,
        Some((&i, rest)) => match &mut nodes[i] {
            Node::Group(_, _, children) => list_mut(children, rest),
            Node::Leaf(_) => unreachable!("paths lead through groups"),
        },
    }
}

fn node_at<'a>(nodes: &'a [Node], path: &[usize]) -> Option<&'a Node> {
    let (&last, init) = path.split_last()?;
    let mut list = nodes;
    for &i in init {
        match &list[i] {
            Node::Group(_, _, children) => list = children,
            Node::Leaf(_) => return None,
        }
    }
    list.get(last)
}

/// Every literal's path.
fn literal_paths(nodes: &[Node], path: &mut Vec<usize>, out: &mut Vec<Vec<usize>>) {
    for (i, node) in nodes.iter().enumerate() {
        path.push(i);
        match node {
            Node::Leaf(TokenTree::Literal(_)) => out.push(path.clone()),
            Node::Group(_, _, children) => literal_paths(children, path, out),
            Node::Leaf(_) => {}
        }
        path.pop();
    }
}

/// Every node's path (for picking a subtree to copy).
fn node_paths(nodes: &[Node], path: &mut Vec<usize>, out: &mut Vec<Vec<usize>>) {
    for (i, node) in nodes.iter().enumerate() {
        path.push(i);
        out.push(path.clone());
        if let Node::Group(_, _, children) = node {
            node_paths(children, path, out);
        }
        path.pop();
    }
}

/// One random edit of `nodes` (which must not be empty unless `fallback` spans a new token);
/// `None` when the chosen edit does not apply (e.g. no literal to change).
pub fn mutate(nodes: &mut Vec<Node>, pool: &Pool, rng: &mut Rng, fallback: Span) -> Option<Site> {
    // A position, uniformly over all lists' slots (a slot past the end allows appending).
    let mut all = Vec::new();
    lists(nodes, &mut Vec::new(), &mut all);
    let total: usize = all.iter().map(|(_, len)| len + 1).sum();
    let mut at = rng.below(total);
    let (path, len) = all
        .into_iter()
        .find(|(_, len)| {
            if at <= *len {
                true
            } else {
                at -= len + 1;
                false
            }
        })
        .expect("a slot");
    let group_span = path
        .is_empty()
        .then_some(fallback)
        .or_else(|| node_at(nodes, &path).map(Node::span))
        .unwrap_or(fallback);
    let list = list_mut(nodes, &path);
    let neighbour = list
        .get(at)
        .or_else(|| at.checked_sub(1).and_then(|i| list.get(i)))
        .map(Node::span)
        .unwrap_or(group_span);
    let site = |lo: usize, hi: usize, touched: Vec<Span>| {
        Some(Site {
            path: path.clone(),
            lo,
            hi,
            touched,
        })
    };
    let occupied = at < len;
    match rng.below(100) {
        // Delete a token or a whole group.
        0..=14 if occupied => {
            let removed = list.remove(at);
            site(at, at, vec![removed.span()])
        }
        // Duplicate it.
        15..=22 if occupied => {
            let copy = list[at].clone();
            let span = copy.span();
            list.insert(at + 1, copy);
            site(at, at + 1, vec![span])
        }
        // Swap it with the next one.
        23..=30 if at + 1 < len => {
            list.swap(at, at + 1);
            site(at, at + 1, vec![list[at].span(), list[at + 1].span()])
        }
        // Replace it with an identifier or a literal.
        31..=45 if occupied => {
            let span = list[at].span();
            list[at] = Node::Leaf(if rng.chance(70) {
                pool.ident(rng, span)
            } else {
                pool.literal(rng, span)
            });
            site(at, at, vec![span])
        }
        // Insert punctuation.
        46..=57 => {
            let punct: &&str = rng.pick(PUNCTS);
            let inserted = punct_nodes(punct, neighbour);
            let n = inserted.len();
            list.splice(at..at, inserted);
            site(at, at + n - 1, vec![neighbour])
        }
        // Insert an identifier (often a keyword).
        58..=65 => {
            list.insert(at, Node::Leaf(pool.ident(rng, neighbour)));
            site(at, at, vec![neighbour])
        }
        // Change a literal (anywhere in the tree).
        66..=75 => {
            let mut paths = Vec::new();
            literal_paths(nodes, &mut Vec::new(), &mut paths);
            if paths.is_empty() {
                return None;
            }
            let target = rng.pick(&paths).clone();
            let (&index, parent) = target.split_last().expect("a path");
            let list = list_mut(nodes, parent);
            let span = list[index].span();
            list[index] = Node::Leaf(pool.literal(rng, span));
            Some(Site {
                path: parent.to_vec(),
                lo: index,
                hi: index,
                touched: vec![span],
            })
        }
        // Change a group's delimiter, empty it, or unwrap it.
        76..=87 if matches!(list.get(at), Some(Node::Group(..))) => {
            let Node::Group(delimiter, span, children) = list[at].clone() else {
                unreachable!()
            };
            match rng.below(3) {
                0 => {
                    let delimiters = [
                        Delimiter::Parenthesis,
                        Delimiter::Brace,
                        Delimiter::Bracket,
                        Delimiter::None,
                    ];
                    let others: Vec<Delimiter> =
                        delimiters.into_iter().filter(|d| *d != delimiter).collect();
                    list[at] = Node::Group(*rng.pick(&others), span, children);
                    site(at, at, vec![span])
                }
                1 => {
                    list[at] = Node::Group(delimiter, span, Vec::new());
                    site(at, at, vec![span])
                }
                _ => {
                    let n = children.len();
                    list.splice(at..=at, children);
                    site(at, (at + n).saturating_sub(1).max(at), vec![span])
                }
            }
        }
        // Wrap a token in a new group.
        88..=91 if occupied => {
            let node = list.remove(at);
            let delimiter =
                *rng.pick(&[Delimiter::Parenthesis, Delimiter::Brace, Delimiter::Bracket]);
            let span = node.span();
            list.insert(at, Node::Group(delimiter, span, vec![node]));
            site(at, at, vec![span])
        }
        // Copy a subtree from elsewhere in the item to here.
        92..=99 => {
            let mut paths = Vec::new();
            node_paths(nodes, &mut Vec::new(), &mut paths);
            if paths.is_empty() {
                return None;
            }
            let source = rng.pick(&paths).clone();
            let copy = node_at(nodes, &source)?.respanned(neighbour);
            let list = list_mut(nodes, &path);
            let at = at.min(list.len());
            list.insert(at, copy);
            Some(Site {
                path: path.clone(),
                lo: at,
                hi: at,
                touched: vec![neighbour],
            })
        }
        _ => None,
    }
}
