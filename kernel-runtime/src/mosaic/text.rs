//! MLIR's textual syntax for the pieces the model holds as text: string literals, symbol names and
//! locations. Every writer (bytecode, MLIR, StableHLO) spells them through here, so a name or a file
//! path with quotes or non-ASCII bytes is escaped one way everywhere.

use crate::error::SourceLoc;
use std::fmt::Write;

/// `loc("file":line:col)`.
pub fn location_text(loc: &SourceLoc) -> String {
    format!("loc({}:{}:{})", mlir_string(loc.file), loc.line, loc.col)
}

/// An MLIR string literal: `"` and `\` and non-printable bytes become `\XX` escapes.
pub fn mlir_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for b in s.bytes() {
        if b == b'"' || b == b'\\' || !(0x20..0x7f).contains(&b) {
            let _ = write!(out, "\\{b:02X}");
        } else {
            out.push(b as char);
        }
    }
    out.push('"');
    out
}

/// A symbol name, quoted when it is not a bare identifier.
pub fn symbol(name: &str) -> String {
    let bare = name
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '$' | '.'));
    if bare {
        name.to_string()
    } else {
        mlir_string(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_escape_quotes_backslashes_and_non_ascii() {
        assert_eq!(mlir_string("a\"b\\c"), r#""a\22b\5Cc""#);
        assert_eq!(mlir_string("é"), r#""\C3\A9""#);
        assert_eq!(symbol("main_1.x"), "main_1.x");
        assert_eq!(symbol("1st kernel"), r#""1st kernel""#);
    }
}
