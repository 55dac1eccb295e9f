//! The encoding pieces of MLIR's bytecode the writer builds a body from: the string section, the
//! per-thread text interner, the attribute/type entry table, sections and MLIR's prefix varints.

use rustc_hash::FxHashMap;
use std::rc::Rc;

#[derive(Default)]
pub(super) struct Strings {
    pub(super) list: Vec<&'static str>,
    pub(super) ids: FxHashMap<&'static str, u64>,
}

impl Strings {
    pub(super) fn intern(&mut self, s: &'static str) -> u64 {
        if let Some(&id) = self.ids.get(s) {
            return id;
        }
        let id = self.list.len() as u64;
        self.list.push(s);
        self.ids.insert(s, id);
        id
    }

    /// `numStrings, reverseStringLengths, stringData` (each string NUL-terminated).
    pub(super) fn section(&self) -> Vec<u8> {
        let mut out = Vec::new();
        varint(&mut out, self.list.len() as u64);
        for s in self.list.iter().rev() {
            varint(&mut out, s.len() as u64 + 1);
        }
        for s in &self.list {
            out.extend_from_slice(s.as_bytes());
            out.push(0);
        }
        out
    }
}

/// Texts seen by this thread's writer, each with a number that outlives one module (so a text is
/// hashed and copied once per thread, not once per module). Cleared when it grows past [`MAX_TEXTS`].
#[derive(Default)]
pub(super) struct Interner {
    pub(super) ids: FxHashMap<Rc<str>, u32>,
    pub(super) texts: Vec<Rc<str>>,
}

pub(super) const MAX_TEXTS: usize = 1 << 16;

impl Interner {
    pub(super) fn get(&mut self, text: &str) -> u32 {
        if let Some(&id) = self.ids.get(text) {
            return id;
        }
        let id = self.texts.len() as u32;
        let text: Rc<str> = text.into();
        self.texts.push(text.clone());
        self.ids.insert(text, id);
        id
    }
}

/// Attribute or type entries of one module, numbered in first-use order: their encodings back to back
/// in `data`, each entry's `(size << 1) | custom` in `sizes`.
#[derive(Default)]
pub(super) struct Entries {
    pub(super) data: Vec<u8>,
    pub(super) sizes: Vec<u64>,
    /// Per interned text: `(module generation, entry id)`.
    pub(super) by_text: Vec<(u32, u64)>,
    pub(super) custom_ids: FxHashMap<Vec<u8>, u64>,
}

impl Entries {
    pub(super) fn clear(&mut self) {
        self.data.clear();
        self.sizes.clear();
        self.custom_ids.clear();
    }

    pub(super) fn push(&mut self, bytes: &[u8], custom: bool) -> u64 {
        self.data.extend_from_slice(bytes);
        self.sizes.push(((bytes.len() as u64) << 1) | custom as u64);
        self.sizes.len() as u64 - 1
    }

    /// An entry in the textual form (NUL-terminated assembly); `sym` is the text's interned number.
    pub(super) fn text(&mut self, gen: u32, sym: u32, text: &str) -> u64 {
        let sym = sym as usize;
        if self.by_text.len() <= sym {
            self.by_text.resize(sym + 1, (u32::MAX, 0));
        }
        if self.by_text[sym].0 == gen {
            return self.by_text[sym].1;
        }
        let id = self.sizes.len() as u64;
        self.data.extend_from_slice(text.as_bytes());
        self.data.push(0);
        self.sizes.push((text.len() as u64 + 1) << 1);
        self.by_text[sym] = (gen, id);
        id
    }

    /// An entry in the builtin dialect's custom encoding.
    pub(super) fn custom(&mut self, bytes: &[u8]) -> u64 {
        if let Some(&id) = self.custom_ids.get(bytes) {
            return id;
        }
        let id = self.push(bytes, true);
        self.custom_ids.insert(bytes.to_vec(), id);
        id
    }
}

pub(super) fn emit_section(out: &mut Vec<u8>, id: u8, data: &[u8]) {
    out.push(id);
    varint(out, data.len() as u64);
    out.extend_from_slice(data);
}

/// MLIR's "PrefixVarInt": the count of trailing zero bits of the first byte is the number of extra
/// bytes; a first byte of 0 is followed by the full 8-byte value.
pub(super) fn varint(out: &mut impl Extend<u8>, v: u64) {
    let bits = 64 - v.leading_zeros().min(63);
    let n = bits.div_ceil(7).max(1) as usize;
    if n > 8 {
        out.extend(std::iter::once(0).chain(v.to_le_bytes()));
        return;
    }
    let enc = (v << n) | (1 << (n - 1));
    out.extend(enc.to_le_bytes().into_iter().take(n));
}

#[cfg(test)]
mod tests {
    use super::varint;

    #[test]
    pub(super) fn varints_use_the_prefix_encoding() {
        let enc = |v| {
            let mut out = Vec::new();
            varint(&mut out, v);
            out
        };
        assert_eq!(enc(0), [0b1]);
        assert_eq!(enc(127), [0xFF]);
        assert_eq!(enc(128), [0b10, 0b10]);
        assert_eq!(enc((1 << 14) - 1), [0xFE, 0xFF]);
        assert_eq!(enc(1 << 14), [0b100, 0, 0b10]);
        assert_eq!(
            enc((1 << 56) - 1),
            [0x80, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF]
        );
        assert_eq!(enc(1 << 56), [0, 0, 0, 0, 0, 0, 0, 0, 1]);
        assert_eq!(
            enc(u64::MAX),
            [0, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF]
        );
    }
}
