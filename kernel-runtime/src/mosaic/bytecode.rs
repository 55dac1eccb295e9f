//! The kernel body libtpu reads, written straight from the Mosaic module as data ([`MModule`]): the
//! mosaic-serde form (every op renamed `stable_mosaic.<op>`, inherent attributes spelled out, per-version
//! downgrades, `stable_mosaic.version = V` on the module) as MLIR bytecode, format version 0 (what jax
//! writes), without building an MLIR module.
//!
//! The format is MLIR's (`mlir/docs/BytecodeFormat.md`): a string section (dialect and op names), a
//! dialect section, attribute/type entries with their offsets, and the IR section. Attributes and types
//! are written in their textual form, which the reader parses, except for the few the reader must
//! build rather than parse (builtin custom encodings): op attribute dictionaries, `function_type`, and
//! memrefs, whose `tpu` memory space a context without the `tpu` dialect cannot parse inside a type.
//!
//! Invariant (tested for every example and an op-coverage suite, `tests/bytecode.rs`): MLIR reads these
//! bytes as exactly the module `mlir::serde::reference_bytecode` gets by building, verifying and rewriting the
//! module through MLIR; the Python suite checks the same against jaxlib's own serializer.

use super::model::{MBlock, MModule, MOp, MType, MValue};
use super::serde::{downgrade_drops, mlir_default_attrs, TPU_DEFAULT_ATTRS};
use super::text::{location_text, mlir_string};
use crate::error::{kerr, Result, SourceLoc};
use rustc_hash::FxHashMap;
use smallvec::SmallVec;

mod encoding;

use encoding::{emit_section, varint, Entries, Interner, Strings, MAX_TEXTS};

/// Section ids (`mlir/Bytecode/Encoding.h`).
mod section {
    pub const STRING: u8 = 0;
    pub const DIALECT: u8 = 1;
    pub const ATTR_TYPE: u8 = 2;
    pub const ATTR_TYPE_OFFSET: u8 = 3;
    pub const IR: u8 = 4;
}

/// Op encoding mask bits.
mod mask {
    pub const HAS_ATTRS: u8 = 0b0000_0001;
    pub const HAS_RESULTS: u8 = 0b0000_0010;
    pub const HAS_OPERANDS: u8 = 0b0000_0100;
    pub const HAS_INLINE_REGIONS: u8 = 0b0001_0000;
}

/// Builtin dialect custom-encoding codes (the order of `BuiltinDialectBytecode.td`'s lists).
mod code {
    pub const DICTIONARY_ATTR: u64 = 1;
    pub const TYPE_ATTR: u64 = 6;
    pub const FUNCTION_TYPE: u64 = 2;
    pub const MEMREF_TYPE_WITH_MEM_SPACE: u64 = 11;
}

/// The serialized body of `m` at `stable_mosaic` version `version`.
pub fn body(m: &MModule, version: i64) -> Result<Vec<u8>> {
    WRITER.with(|w| match w.try_borrow_mut() {
        Ok(mut w) => {
            w.reset(version);
            w.write(m, version)
        }
        // Re-entered on this thread (not done today): a fresh writer.
        Err(_) => {
            let mut w = Writer::default();
            w.reset(version);
            w.write(m, version)
        }
    })
}

thread_local! {
    /// One writer per thread, reused: its tables keep their capacity and its text interner persists.
    static WRITER: std::cell::RefCell<Writer> = std::cell::RefCell::new(Writer::default());
}

impl Writer {
    fn write(&mut self, m: &MModule, version: i64) -> Result<Vec<u8>> {
        let w = self;
        w.strings.intern("builtin");
        w.strings.intern("stable_mosaic");
        w.strings.intern("module");

        // The IR section: one top-level block holding the module.
        let mut ir = Vec::with_capacity(64 * 1024);
        varint(&mut ir, 1 << 1);
        varint(&mut ir, 0); // op name 0: builtin.module
        ir.push(mask::HAS_ATTRS | mask::HAS_INLINE_REGIONS);
        let loc = w.location(&m.loc);
        varint(&mut ir, loc);
        let name = w.attr_text(&mlir_string(&m.name));
        let ver = w.attr_text(&format!("{version} : i64"));
        let dict = w.dictionary(&mut [("stable_mosaic.version", ver), ("sym_name", name)]);
        varint(&mut ir, dict);
        varint(&mut ir, (1 << 1) | 1); // one region, isolated from above
        varint(&mut ir, 1); // one block
        varint(&mut ir, 0); // defining no values
        varint(&mut ir, (m.funcs.len() as u64) << 1);
        let mut ids = Vec::new();
        for f in &m.funcs {
            let op = w.op_name("func.func");
            varint(&mut ir, op);
            ir.push(mask::HAS_ATTRS | mask::HAS_INLINE_REGIONS);
            let loc = w.location(&f.loc);
            varint(&mut ir, loc);
            let inputs: SmallVec<[u64; 8]> = f.inputs.iter().map(|t| w.ty(t)).collect();
            let results: SmallVec<[u64; 8]> = f.results.iter().map(|t| w.ty(t)).collect();
            let fty = w.function_type(&inputs, &results);
            let mut attrs: SmallVec<[(&str, u64); 8]> = SmallVec::new();
            attrs.push(("function_type", w.type_attr(fty)));
            attrs.push(("sym_name", w.attr_text(&mlir_string(&f.name))));
            for (k, v) in &f.attrs {
                attrs.push((k, w.attr_text(v)));
            }
            let dict = w.dictionary(&mut attrs);
            varint(&mut ir, dict);
            varint(&mut ir, 1 << 1); // one region, not isolated (the op is unregistered)
            ids.clear();
            ids.resize(f.num_values as usize, u64::MAX);
            w.region(&mut ir, Some(&f.body), 0, &mut ids)?;
        }

        let mut out = Vec::with_capacity(ir.len() + w.attrs.data.len() + w.types.data.len() + 256);
        out.extend_from_slice(b"ML\xefR");
        varint(&mut out, 0); // bytecode format version 0, as jax writes it
        out.extend_from_slice(b"tpu-kernel\0");
        emit_section(&mut out, section::STRING, &w.strings.section());
        emit_section(&mut out, section::DIALECT, &w.dialect_section());
        let offsets = w.attr_type_offsets();
        out.push(section::ATTR_TYPE);
        varint(&mut out, (w.attrs.data.len() + w.types.data.len()) as u64);
        out.extend_from_slice(&w.attrs.data);
        out.extend_from_slice(&w.types.data);
        emit_section(&mut out, section::ATTR_TYPE_OFFSET, &offsets);
        emit_section(&mut out, section::IR, &ir);
        Ok(out)
    }
}

#[derive(Default)]
struct Writer {
    version: i64,
    /// This module's number: entries stamped with another generation belong to earlier modules.
    gen: u32,
    interner: Interner,
    strings: Strings,
    /// `stable_mosaic` op names (op name ids from 1; 0 is `builtin.module`), as string ids.
    ops: Vec<u64>,
    op_ids: FxHashMap<&'static str, u64>,
    attrs: Entries,
    types: Entries,
    /// Memos across modules: a location's and an attribute name's interned text.
    locs: FxHashMap<SourceLoc, u32>,
    names: FxHashMap<&'static str, u32>,
    /// This module's memref type entries.
    memrefs: FxHashMap<MType, u64>,
    scratch: Vec<u8>,
}

impl Writer {
    /// Start a new module.
    fn reset(&mut self, version: i64) {
        self.version = version;
        self.gen = self.gen.wrapping_add(1);
        if self.interner.ids.len() > MAX_TEXTS || self.gen == u32::MAX {
            *self = Writer::default();
            self.version = version;
            self.gen = 1;
        }
        self.strings = Strings::default();
        self.ops.clear();
        self.op_ids.clear();
        self.attrs.clear();
        self.types.clear();
        self.memrefs.clear();
    }

    fn attr_text(&mut self, text: &str) -> u64 {
        let sym = self.interner.get(text);
        self.attrs.text(self.gen, sym, text)
    }

    fn type_text(&mut self, text: &str) -> u64 {
        let sym = self.interner.get(text);
        self.types.text(self.gen, sym, text)
    }

    fn op_name(&mut self, name: &'static str) -> u64 {
        if let Some(&id) = self.op_ids.get(name) {
            return id;
        }
        let s = self.strings.intern(name);
        self.ops.push(s);
        let id = self.ops.len() as u64;
        self.op_ids.insert(name, id);
        id
    }

    fn location(&mut self, loc: &SourceLoc) -> u64 {
        let sym = match self.locs.get(loc) {
            Some(&sym) => sym,
            None => {
                let sym = self.interner.get(&location_text(loc));
                self.locs.insert(*loc, sym);
                sym
            }
        };
        self.attrs
            .text(self.gen, sym, &self.interner.texts[sym as usize])
    }

    /// The string attribute naming an attribute.
    fn attr_name(&mut self, name: &'static str) -> u64 {
        let sym = match self.names.get(name) {
            Some(&sym) => sym,
            None => {
                let sym = self.interner.get(&mlir_string(name));
                self.names.insert(name, sym);
                sym
            }
        };
        self.attrs
            .text(self.gen, sym, &self.interner.texts[sym as usize])
    }

    /// A dictionary attribute (custom encoding: its values may hold memrefs), keys sorted as MLIR
    /// keeps them.
    fn dictionary(&mut self, entries: &mut [(&'static str, u64)]) -> u64 {
        entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
        let mut bytes = std::mem::take(&mut self.scratch);
        bytes.clear();
        varint(&mut bytes, code::DICTIONARY_ATTR);
        varint(&mut bytes, entries.len() as u64);
        for (k, v) in entries.iter() {
            let name = self.attr_name(k);
            varint(&mut bytes, name);
            varint(&mut bytes, *v);
        }
        let id = self.attrs.custom(&bytes);
        self.scratch = bytes;
        id
    }

    fn type_attr(&mut self, ty: u64) -> u64 {
        let mut bytes = SmallVec::<[u8; 16]>::new();
        varint(&mut bytes, code::TYPE_ATTR);
        varint(&mut bytes, ty);
        self.attrs.custom(&bytes)
    }

    fn function_type(&mut self, inputs: &[u64], results: &[u64]) -> u64 {
        let mut bytes = SmallVec::<[u8; 64]>::new();
        varint(&mut bytes, code::FUNCTION_TYPE);
        for list in [inputs, results] {
            varint(&mut bytes, list.len() as u64);
            for t in list {
                varint(&mut bytes, *t);
            }
        }
        self.types.custom(&bytes)
    }

    fn ty(&mut self, t: &MType) -> u64 {
        match t {
            MType::Plain(text) => self.type_text(text),
            MType::MemRef { shape, elem, space } => {
                if let Some(&id) = self.memrefs.get(t) {
                    return id;
                }
                let space = self.attr_text(space);
                let elem = self.type_text(elem);
                let dims = (0..shape.len())
                    .map(|i| format!("d{i}"))
                    .collect::<Vec<_>>()
                    .join(", ");
                let layout = self.attr_text(&format!("affine_map<({dims}) -> ({dims})>"));
                let mut bytes = SmallVec::<[u8; 32]>::new();
                varint(&mut bytes, code::MEMREF_TYPE_WITH_MEM_SPACE);
                varint(&mut bytes, space);
                varint(&mut bytes, shape.len() as u64);
                for &d in shape {
                    let d = super::model::dim_i64(d);
                    varint(&mut bytes, ((d << 1) ^ (d >> 63)) as u64);
                }
                varint(&mut bytes, elem);
                varint(&mut bytes, layout);
                let id = self.types.custom(&bytes);
                self.memrefs.insert(t.clone(), id);
                id
            }
        }
    }

    /// A region: its block (or none), the values it defines numbered from `base` (MLIR numbers the
    /// values of a region after those of the regions enclosing it, within one isolated scope).
    fn region(
        &mut self,
        out: &mut Vec<u8>,
        block: Option<&MBlock>,
        base: u64,
        ids: &mut [u64],
    ) -> Result<()> {
        let Some(b) = block else {
            varint(out, 0);
            return Ok(());
        };
        varint(out, 1);
        let defined = b.num_defined() as u64;
        varint(out, defined);
        let mut next = base;
        let mut define = |v: MValue, ids: &mut [u64]| -> Result<()> {
            let slot = ids
                .get_mut(v as usize)
                .ok_or_else(|| kerr!(Lowering, "value %{v} out of range while serializing"))?;
            *slot = next;
            next += 1;
            Ok(())
        };
        varint(out, ((b.ops.len() as u64) << 1) | !b.args.is_empty() as u64);
        if !b.args.is_empty() {
            varint(out, b.args.len() as u64);
            let loc = match &b.arg_loc {
                Some(l) => self.location(l),
                None => self.attr_text("loc(unknown)"),
            };
            for (v, t) in &b.args {
                let ty = self.ty(t);
                varint(out, ty);
                varint(out, loc);
                define(*v, ids)?;
            }
        }
        for op in &b.ops {
            self.op(out, op, ids)?;
            for (v, _) in &op.results {
                define(*v, ids)?;
            }
            for r in &op.regions {
                self.region(out, r.as_ref(), base + defined, ids)?;
            }
        }
        Ok(())
    }

    /// An op without its regions (they follow it, as the reader expects).
    fn op(&mut self, out: &mut Vec<u8>, op: &MOp, ids: &[u64]) -> Result<()> {
        let name = self.op_name(op.name);
        varint(out, name);
        let drops = downgrade_drops(
            op.name,
            |k| {
                op.attrs
                    .iter()
                    .find(|(a, _)| *a == k)
                    .map(|(_, v)| v.clone())
            },
            self.version,
        )?;
        let mut attrs: SmallVec<[(&'static str, u64); 8]> = SmallVec::new();
        for (k, v) in &op.attrs {
            if !drops.contains(k) {
                attrs.push((k, self.attr_text(v)));
            }
        }
        let implied = TPU_DEFAULT_ATTRS
            .iter()
            .filter(|(o, _, _)| *o == op.name)
            .map(|(_, k, v)| (*k, *v))
            .chain(mlir_default_attrs(op.name).iter().copied());
        for (k, v) in implied {
            if !op.attrs.iter().any(|(a, _)| *a == k) && !drops.contains(&k) {
                attrs.push((k, self.attr_text(v)));
            }
        }
        let mut m = 0;
        if !attrs.is_empty() {
            m |= mask::HAS_ATTRS;
        }
        if !op.results.is_empty() {
            m |= mask::HAS_RESULTS;
        }
        if !op.operands.is_empty() {
            m |= mask::HAS_OPERANDS;
        }
        if !op.regions.is_empty() {
            m |= mask::HAS_INLINE_REGIONS;
        }
        out.push(m);
        let loc = self.location(&op.loc);
        varint(out, loc);
        if !attrs.is_empty() {
            let dict = self.dictionary(&mut attrs);
            varint(out, dict);
        }
        if !op.results.is_empty() {
            varint(out, op.results.len() as u64);
            for (_, t) in &op.results {
                let ty = self.ty(t);
                varint(out, ty);
            }
        }
        if !op.operands.is_empty() {
            varint(out, op.operands.len() as u64);
            for v in &op.operands {
                let id = ids.get(*v as usize).copied().unwrap_or(u64::MAX);
                if id == u64::MAX {
                    return Err(kerr!(
                        Lowering,
                        "`{}` uses %{v} before its definition while serializing",
                        op.name
                    ));
                }
                varint(out, id);
            }
        }
        if !op.regions.is_empty() {
            varint(out, (op.regions.len() as u64) << 1);
        }
        Ok(())
    }

    /// `numDialects, dialect names, op names grouped by dialect` (version 0: plain string ids).
    fn dialect_section(&self) -> Vec<u8> {
        let mut out = Vec::new();
        varint(&mut out, 2);
        varint(&mut out, 0); // "builtin"
        varint(&mut out, 1); // "stable_mosaic"
        varint(&mut out, 0);
        varint(&mut out, 1);
        varint(&mut out, 2); // builtin: "module"
        if !self.ops.is_empty() {
            varint(&mut out, 1);
            varint(&mut out, self.ops.len() as u64);
            for s in &self.ops {
                varint(&mut out, *s);
            }
        }
        out
    }

    /// The attribute/type offset section: every entry in one `builtin` group per kind.
    fn attr_type_offsets(&self) -> Vec<u8> {
        let mut offsets =
            Vec::with_capacity(2 * (self.attrs.sizes.len() + self.types.sizes.len()) + 8);
        varint(&mut offsets, self.attrs.sizes.len() as u64);
        varint(&mut offsets, self.types.sizes.len() as u64);
        for entries in [&self.attrs, &self.types] {
            if entries.sizes.is_empty() {
                continue;
            }
            varint(&mut offsets, 0); // dialect "builtin"
            varint(&mut offsets, entries.sizes.len() as u64);
            for s in &entries.sizes {
                varint(&mut offsets, *s);
            }
        }
        offsets
    }
}
