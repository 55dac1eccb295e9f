//! The seeds: every `#[tpu_kernel]`, `#[kernel_fn]` and `#[export]` item and every
//! `export_library!` input in the repository's Rust files (examples, tests, trybuild cases,
//! kernel libraries), as the tokens the macro receives.

use std::path::{Path, PathBuf};
use std::str::FromStr;

use proc_macro2::{Delimiter, TokenStream, TokenTree};

/// Which entry point a seed goes through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Macro {
    TpuKernel,
    KernelFn,
    Export,
    ExportLibrary,
}

impl Macro {
    fn of_attribute(name: &str) -> Option<Macro> {
        match name {
            "tpu_kernel" => Some(Macro::TpuKernel),
            "kernel_fn" => Some(Macro::KernelFn),
            "export" => Some(Macro::Export),
            _ => None,
        }
    }

    /// The expansion, through the core's public entry points.
    pub fn expand(self, attr: TokenStream, item: TokenStream) -> TokenStream {
        match self {
            Macro::TpuKernel => kernel_macros_core::tpu_kernel(attr, item),
            Macro::KernelFn => kernel_macros_core::kernel_fn(attr, item),
            Macro::Export => kernel_macros_core::export(attr, item),
            Macro::ExportLibrary => kernel_macros_core::export_library(item),
        }
    }

    /// Whether the body of the item is rewritten (and so must stay rewritten around a mistake).
    pub fn rewrites_body(self) -> bool {
        matches!(self, Macro::TpuKernel | Macro::KernelFn)
    }
}

/// One macro input found in a file.
#[derive(Clone)]
pub struct Seed {
    pub file: PathBuf,
    pub line: usize,
    pub kind: Macro,
    /// The attribute's arguments (empty for `export_library!`).
    pub attr: TokenStream,
    /// The item (or `export_library!`'s input).
    pub item: TokenStream,
}

/// The Rust files the seeds come from, relative to the repository root.
const ROOTS: &[&str] = &[
    "examples",
    "tests",
    "examples-lib",
    "kernel-macros/tests",
    "src",
];

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root")
        .to_path_buf()
}

/// Every seed of the repository, in a stable order (sorted files, source order).
pub fn seeds() -> (Vec<Seed>, Vec<PathBuf>) {
    let root = repo_root();
    let mut files = Vec::new();
    for dir in ROOTS {
        rust_files(&root.join(dir), &mut files);
    }
    files.sort();
    let mut seeds = Vec::new();
    let mut unlexed = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).expect("read a source file");
        match TokenStream::from_str(&text) {
            Ok(tokens) => find_seeds(&file, tokens, &mut seeds),
            Err(_) => unlexed.push(file),
        }
    }
    (seeds, unlexed)
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            // Build outputs and data are not sources.
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if name != "target" && name != "data" && name != "snapshots" {
                rust_files(&path, out);
            }
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

fn find_seeds(file: &Path, tokens: TokenStream, seeds: &mut Vec<Seed>) {
    let trees: Vec<TokenTree> = tokens.into_iter().collect();
    let mut i = 0;
    while i < trees.len() {
        if let Some((kind, attr)) = our_attribute(&trees[i..]) {
            let start = i + 2;
            let end = item_end(&trees, start);
            seeds.push(Seed {
                file: file.to_path_buf(),
                line: trees[i].span().start().line,
                kind,
                attr,
                item: trees[start..end].iter().cloned().collect(),
            });
            i = end;
            continue;
        }
        if let [TokenTree::Ident(name), TokenTree::Punct(bang), TokenTree::Group(group), ..] =
            &trees[i..]
        {
            if name == "export_library" && bang.as_char() == '!' {
                seeds.push(Seed {
                    file: file.to_path_buf(),
                    line: name.span().start().line,
                    kind: Macro::ExportLibrary,
                    attr: TokenStream::new(),
                    item: group.stream(),
                });
                i += 3;
                continue;
            }
        }
        if let TokenTree::Group(group) = &trees[i] {
            find_seeds(file, group.stream(), seeds);
        }
        i += 1;
    }
}

/// `# [tpu_kernel]`, `# [kernel_fn(..)]`, `# [tpu_kernel::export(..)]`, ...: the macro and its
/// arguments.
fn our_attribute(trees: &[TokenTree]) -> Option<(Macro, TokenStream)> {
    let [TokenTree::Punct(hash), TokenTree::Group(group), ..] = trees else {
        return None;
    };
    if hash.as_char() != '#' || group.delimiter() != Delimiter::Bracket {
        return None;
    }
    let inside: Vec<TokenTree> = group.stream().into_iter().collect();
    // The path's last identifier, then nothing or one parenthesized group.
    let args_at = inside
        .iter()
        .position(|t| matches!(t, TokenTree::Group(_)))
        .unwrap_or(inside.len());
    let name = inside[..args_at].iter().rev().find_map(|t| match t {
        TokenTree::Ident(ident) => Some(ident.to_string()),
        _ => None,
    })?;
    let kind = Macro::of_attribute(&name)?;
    let args = match &inside[args_at..] {
        [] => TokenStream::new(),
        [TokenTree::Group(args)] if args.delimiter() == Delimiter::Parenthesis => args.stream(),
        _ => return None,
    };
    Some((kind, args))
}

/// The end (exclusive) of the item starting at `start`: through its first `{ .. }` group or `;`.
fn item_end(trees: &[TokenTree], start: usize) -> usize {
    let mut i = start;
    while i < trees.len() {
        match &trees[i] {
            TokenTree::Group(group) if group.delimiter() == Delimiter::Brace => return i + 1,
            TokenTree::Punct(punct) if punct.as_char() == ';' => return i + 1,
            _ => i += 1,
        }
    }
    trees.len()
}
