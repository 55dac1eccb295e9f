//! What libtpu wrote while it compiled one program, read back from its dump directories: the `llo.*`
//! ops of the final Mosaic stage (`*-post-finalize-llo*`), the final VLIW schedule's bundle total per
//! program (`<id>-<program>-NN-schedule-analysis_final_bundles.txt`), and the optimized HLO module
//! (XLA's `*.after_codegen.txt`), whose `tpu_custom_call`s name the kernel's programs and carry
//! the VMEM libtpu reserved (`used_scoped_memory_configs`).
//!
//! The rules are the Python path's (`python/tpu_toolchain.py`), so both count the same thing; the
//! test `libtpu_agrees_with_the_python_path` holds them equal.

use super::schedule::{parse_schedule, Schedule};
use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};

/// The dump directories of one worker (one libtpu process: `LIBTPU_INIT_ARGS` is read once).
#[derive(Clone, Debug)]
pub(crate) struct DumpDirs {
    pub root: PathBuf,
}

impl DumpDirs {
    pub fn mosaic(&self) -> PathBuf {
        self.root.join("mosaic")
    }
    pub fn llo(&self) -> PathBuf {
        self.root.join("llo")
    }
    pub fn hlo(&self) -> PathBuf {
        self.root.join("hlo")
    }

    /// The libtpu flags (`LIBTPU_INIT_ARGS`) that point its backend dumps here, narrowed to the final
    /// schedule (a few small files per compile), and with `mosaic` its Mosaic stage dumps (for the
    /// LLO op counts).
    pub fn init_args(&self, mosaic: bool) -> Vec<String> {
        let mut args = vec![
            format!("--xla_jf_dump_to={}", self.llo().display()),
            "--xla_jf_dump_llo_pass_label_regex=final_bundles".to_string(),
        ];
        if mosaic {
            args.push(format!("--xla_mosaic_dump_to={}", self.mosaic().display()));
        }
        args
    }

    /// The XLA flags (`XLA_FLAGS`, which libtpu reads; `LIBTPU_INIT_ARGS` refuses them) that dump the
    /// HLO module as text, before and after optimization only.
    pub fn xla_flags(&self) -> String {
        format!(
            "--xla_dump_to={} --xla_dump_hlo_as_text --xla_dump_hlo_pass_re=^$",
            self.hlo().display()
        )
    }

    pub fn create(&self) -> std::io::Result<()> {
        for d in [self.mosaic(), self.llo(), self.hlo()] {
            std::fs::create_dir_all(d)?;
        }
        Ok(())
    }

    /// Every file in the three directories now.
    pub fn snapshot(&self) -> HashSet<PathBuf> {
        [self.mosaic(), self.llo(), self.hlo()]
            .iter()
            .flat_map(|d| list(d))
            .collect()
    }
}

fn list(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .map(|it| it.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default()
}

/// What one compile left in the dumps.
#[derive(Debug, Default)]
pub(crate) struct Found {
    pub llo_counts: BTreeMap<String, u64>,
    pub has_llo: bool,
    pub bundles_by_program: BTreeMap<String, u64>,
    pub schedules: BTreeMap<String, Schedule>,
    pub hlo: Option<String>,
}

/// Read the files written since `before` (a failed compile's dumps may be partial: then only whole
/// bundle files count and the LLO dump is not read), and remove them so the directories stay small.
pub(crate) fn collect(dirs: &DumpDirs, before: &HashSet<PathBuf>, complete: bool) -> Found {
    let mut found = Found::default();
    let new_in = |d: PathBuf| {
        let mut v: Vec<PathBuf> = list(&d)
            .into_iter()
            .filter(|p| !before.contains(p))
            .collect();
        v.sort();
        v
    };
    let (mosaic, llo, hlo) = (
        new_in(dirs.mosaic()),
        new_in(dirs.llo()),
        new_in(dirs.hlo()),
    );
    if complete {
        if let Some(last) = mosaic
            .iter()
            .rfind(|p| name(p).contains("post-finalize-llo"))
        {
            if let Ok(text) = std::fs::read_to_string(last) {
                found.llo_counts = count_llo(&text);
                found.has_llo = true;
            }
        }
        // The module after libtpu's codegen is the one whose custom calls carry the VMEM they were
        // given (what jax's `hlo_modules()` returns); after optimization, as a fallback.
        for suffix in [".after_codegen.txt", ".after_optimizations.txt"] {
            found.hlo = hlo
                .iter()
                .filter(|p| name(p).ends_with(suffix))
                .filter_map(|p| std::fs::read_to_string(p).ok())
                .reduce(|a, b| a + "\n" + &b);
            if found.hlo.is_some() {
                break;
            }
        }
    }
    for p in &llo {
        if let Some(program) = schedule_program(name(p)) {
            if complete && program != "TLP" && !program.starts_with("<late-") {
                if let Ok(text) = std::fs::read_to_string(p) {
                    found
                        .schedules
                        .insert(program.to_string(), parse_schedule(&text));
                }
            }
            continue;
        }
        let Some(program) = bundle_program(name(p)) else {
            continue;
        };
        if program == "TLP" || program.starts_with("<late-") {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(p) else {
            continue;
        };
        match total_bundles(&text) {
            Some(n) => {
                found.bundles_by_program.insert(program.to_string(), n);
            }
            None if complete => {
                found.bundles_by_program.insert(program.to_string(), 0);
            }
            None => {}
        }
    }
    for p in mosaic.iter().chain(&llo).chain(&hlo) {
        let _ = if p.is_dir() {
            std::fs::remove_dir_all(p)
        } else {
            std::fs::remove_file(p)
        };
    }
    found
}

fn name(p: &Path) -> &str {
    p.file_name().and_then(|n| n.to_str()).unwrap_or("")
}

/// `<id>-<program>-NN-schedule-analysis_final_bundles.txt` → `<program>`.
fn bundle_program(file: &str) -> Option<&str> {
    program_of(file.strip_suffix("-schedule-analysis_final_bundles.txt")?)
}

/// `<id>-<program>-NN` (the stem of a backend dump file) → `<program>`.
fn program_of(stem: &str) -> Option<&str> {
    let (rest, nn) = stem.rsplit_once('-')?;
    let (id, program) = rest.split_once('-')?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    (digits(id) && digits(nn) && !program.is_empty()).then_some(program)
}

/// `<id>-<program>-NN-final_bundles.txt` (the schedule itself) → `<program>`.
fn schedule_program(file: &str) -> Option<&str> {
    let stem = file.strip_suffix("-final_bundles.txt")?;
    if stem.ends_with("-schedule-analysis") {
        return None;
    }
    program_of(stem)
}

/// `total scheduled bundles: N` of a final-schedule dump; an empty file (nothing to schedule) is 0;
/// `None` when the file holds no such line (cut short) or more than one.
fn total_bundles(text: &str) -> Option<u64> {
    if text.trim().is_empty() {
        return Some(0);
    }
    let mut totals = text.lines().filter_map(|l| {
        l.trim()
            .strip_prefix("total scheduled bundles:")
            .and_then(|n| n.trim().parse::<u64>().ok())
    });
    let first = totals.next()?;
    totals.next().is_none().then_some(first)
}

/// `llo.*` ops of a Mosaic dump: lines whose statement starts with an `llo.` op name (optionally after
/// `%x = ` and a quote); attributes such as `llo.type` do not count.
pub(crate) fn count_llo(text: &str) -> BTreeMap<String, u64> {
    let mut counts = BTreeMap::new();
    for line in text.lines() {
        if let Some(op) = op_name(line).filter(|op| op.starts_with("llo.")) {
            *counts.entry(op.to_string()).or_insert(0) += 1;
        }
    }
    counts
}

/// The op a line of MLIR text starts with: `  %3 = "llo.foo"(...)` / `llo.bar %x` → the name.
fn op_name(line: &str) -> Option<&str> {
    let mut s = line.trim_start();
    if s.starts_with('%') {
        s = s[s.find('=')? + 1..].trim_start();
    }
    let s = s.strip_prefix('"').unwrap_or(s);
    let b = s.as_bytes();
    let dialect = b
        .iter()
        .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || **c == b'_')
        .count();
    if dialect == 0 || b[0].is_ascii_digit() || b.get(dialect) != Some(&b'.') {
        return None;
    }
    let rest = b[dialect + 1..]
        .iter()
        .take_while(|c| c.is_ascii_alphanumeric() || **c == b'_' || **c == b'.')
        .count();
    if rest == 0 {
        return None;
    }
    let end = dialect + 1 + rest;
    let after = match b.get(end) {
        Some(b'"') => b.get(end + 1),
        other => other,
    };
    match after {
        None => Some(&s[..end]),
        Some(c) if c.is_ascii_whitespace() || b"(<{:\"".contains(c) => Some(&s[..end]),
        _ => None,
    }
}

/// What the optimized HLO module says of the kernel: the names of its `tpu_custom_call`
/// instructions (libtpu names each one's program after it) and the VMEM each reserved.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct HloFacts {
    pub custom_calls: Vec<String>,
    pub used_vmem: Vec<u64>,
}

pub(crate) fn hlo_facts(hlo: &str) -> HloFacts {
    let mut facts = HloFacts::default();
    for line in hlo.lines() {
        if !line.contains("custom_call_target=\"tpu_custom_call\"")
            || !line.contains("custom-call(")
        {
            continue;
        }
        let l = line.trim_start();
        let l = l.strip_prefix("ROOT ").unwrap_or(l).trim_start();
        let l = l.strip_prefix('%').unwrap_or(l);
        if let Some((name, _)) = l.split_once(|c: char| c.is_whitespace() || c == '=') {
            if !name.is_empty() {
                facts.custom_calls.push(name.to_string());
            }
        }
    }
    // `"used_scoped_memory_configs":[{"memory_space":"1","offset":"<n>","size":"<n>"` (VMEM is space 1)
    let key = "\"used_scoped_memory_configs\":[{\"memory_space\":\"1\",\"offset\":\"";
    let mut rest = hlo;
    while let Some(i) = rest.find(key) {
        rest = &rest[i + key.len()..];
        let offset_digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        let after = &rest[offset_digits..];
        if offset_digits > 0 {
            if let Some(size) = after.strip_prefix("\",\"size\":\"") {
                let n = size.bytes().take_while(u8::is_ascii_digit).count();
                if let Ok(v) = size[..n].parse() {
                    facts.used_vmem.push(v);
                }
            }
        }
    }
    facts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llo_ops_are_counted_by_statement() {
        let text = "  %0 = \"llo.vadd\"(%a, %b) : (i32) -> i32\n\
                    llo.sst %x, %y\n\
                    %1 = llo.vmul %a {llo.type = 3}\n\
                    \"llo.region\"() ({\n\
                    // llo.comment\n\
                    %2 = arith.addi %a, %b\n\
                    %3 = llo.constant\n";
        let c = count_llo(text);
        assert_eq!(c.get("llo.vadd"), Some(&1));
        assert_eq!(c.get("llo.sst"), Some(&1));
        assert_eq!(c.get("llo.vmul"), Some(&1));
        assert_eq!(c.get("llo.region"), Some(&1));
        assert_eq!(c.get("llo.constant"), Some(&1));
        assert_eq!(c.values().sum::<u64>(), 5);
    }

    #[test]
    fn bundle_files_name_their_program() {
        assert_eq!(
            bundle_program("0007-add.1-12-schedule-analysis_final_bundles.txt"),
            Some("add.1")
        );
        assert_eq!(
            bundle_program("0001-my-kernel-03-schedule-analysis_final_bundles.txt"),
            Some("my-kernel")
        );
        assert_eq!(bundle_program("0001-x-schedule-analysis.txt"), None);
        assert_eq!(
            total_bundles("a\n total scheduled bundles: 42 \n"),
            Some(42)
        );
        assert_eq!(total_bundles(""), Some(0));
        assert_eq!(total_bundles("cut sh"), None);
    }

    #[test]
    fn schedule_files_name_their_program() {
        assert_eq!(
            schedule_program("0012-name.1-01-final_bundles.txt"),
            Some("name.1")
        );
        assert_eq!(
            schedule_program("0012-name.1-00-schedule-analysis_final_bundles.txt"),
            None
        );
    }

    #[test]
    fn hlo_names_the_custom_calls_and_their_vmem() {
        let hlo = "ENTRY %main {\n  %p = f32[8]{0} parameter(0)\n  ROOT %k.1 = f32[8]{0} custom-call(%p), \
                   custom_call_target=\"tpu_custom_call\", backend_config={\"used_scoped_memory_configs\":\
                   [{\"memory_space\":\"1\",\"offset\":\"0\",\"size\":\"4096\"}]}\n}\n";
        let f = hlo_facts(hlo);
        assert_eq!(f.custom_calls, ["k.1"]);
        assert_eq!(f.used_vmem, [4096]);
    }
}
