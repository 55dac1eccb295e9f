//! `tune`: choose a kernel's static parameters (block sizes, ...) for a TPU generation with no TPU.
//!
//! A kernel declares its search space ([`Space`]: per parameter a list of candidates — divisors,
//! powers of two, ranges — and constraints between them); every configuration is built for the
//! [`Target`] first, so our tiling and VMEM checks prune it before any compile (the reason kept);
//! the rest compile in parallel libtpu workers ([`Compiler`]) and are ranked by the static cost model
//! of [`cost`] on libtpu's own schedule (`docs/tune.md`). Results are cached in a JSON
//! file per generation, keyed by the kernel, its inputs' and outputs' shapes and dtypes and the static
//! parameters the caller names; the same key over the same space is answered without a compile.
//!
//! ```no_run
//! # use kernel_runtime::libtpu::tune::{tune, Space, Options, divisors};
//! # use kernel_runtime::{PallasCall, KernelError, Target};
//! # fn matmul(bm: usize, bn: usize, bk: usize) -> Result<PallasCall, KernelError> { unimplemented!() }
//! let space = Space::new()
//!     .param("bm", divisors(1024).filter(|d| d % 128 == 0))
//!     .param("bn", [128, 256, 512])
//!     .param("bk", [128, 256, 512])
//!     .constraint("bm * bn <= 256 * 512", |c| c["bm"] * c["bn"] <= 256 * 512);
//! let tuned = tune("matmul", Target::V6e, &space, &Options::default(), |c| {
//!     matmul(c["bm"] as usize, c["bn"] as usize, c["bk"] as usize)
//! })?;
//! println!("{}", tuned.best);
//! # Ok::<(), KernelError>(())
//! ```

pub use super::cost::Copies;
use super::cost::{self, Estimate};
use super::{Compiler, Job};
use crate::error::{ErrorKind, KernelError};
use crate::serialize::CustomCall;
use crate::{PallasCall, Target};
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

/// One configuration: parameter name → value.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Config(pub BTreeMap<String, i64>);

impl std::ops::Index<&str> for Config {
    type Output = i64;
    /// The value of `name`; panics if the space has no such parameter (a bug in the caller's build
    /// function, not a user input).
    fn index(&self, name: &str) -> &i64 {
        self.0
            .get(name)
            .unwrap_or_else(|| panic!("the tuning space has no parameter `{name}`"))
    }
}

impl fmt::Display for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self.0.iter().map(|(k, v)| format!("{k}={v}")).collect();
        write!(f, "{}", parts.join(","))
    }
}

type Constraint = (String, Box<dyn Fn(&Config) -> bool + Sync>);

/// A search space: parameters with their candidates, and constraints between them.
#[derive(Default)]
pub struct Space {
    params: Vec<(String, Vec<i64>)>,
    constraints: Vec<Constraint>,
}

/// The divisors of `n`, ascending.
pub fn divisors(n: i64) -> impl Iterator<Item = i64> + Clone {
    (1..=n.max(0)).filter(move |d| n % d == 0)
}

/// The powers of two from `lo` to `hi` (inclusive), ascending.
pub fn powers_of_two(lo: i64, hi: i64) -> impl Iterator<Item = i64> + Clone {
    (0..63)
        .map(|e| 1i64 << e)
        .filter(move |p| *p >= lo && *p <= hi)
}

/// `start, start + step, ...` below `end`.
pub fn range(start: i64, end: i64, step: i64) -> impl Iterator<Item = i64> + Clone {
    (start..end).step_by(step.max(1) as usize)
}

impl Space {
    pub fn new() -> Space {
        Space::default()
    }

    /// A parameter and its candidates (duplicates dropped, order kept).
    pub fn param(mut self, name: &str, candidates: impl IntoIterator<Item = i64>) -> Space {
        let mut seen = Vec::new();
        for c in candidates {
            if !seen.contains(&c) {
                seen.push(c);
            }
        }
        self.params.push((name.to_string(), seen));
        self
    }

    /// A constraint every configuration must meet (`what` names it in reports).
    pub fn constraint(
        mut self,
        what: &str,
        holds: impl Fn(&Config) -> bool + Sync + 'static,
    ) -> Space {
        self.constraints.push((what.to_string(), Box::new(holds)));
        self
    }

    /// Every configuration of the parameters' product that meets the constraints, and how many the
    /// constraints removed.
    pub fn configs(&self) -> (Vec<Config>, usize) {
        let mut all = vec![Config::default()];
        for (name, values) in &self.params {
            all = all
                .into_iter()
                .flat_map(|c| {
                    values.iter().map(move |v| {
                        let mut c = c.clone();
                        c.0.insert(name.clone(), *v);
                        c
                    })
                })
                .collect();
        }
        let total = all.len();
        all.retain(|c| self.constraints.iter().all(|(_, holds)| holds(c)));
        let removed = total - all.len();
        (all, removed)
    }

    /// The space as text: `bm=[128,256];bn=[...]|constraint names` (part of the cache key).
    pub fn describe(&self) -> String {
        let params: Vec<String> = self
            .params
            .iter()
            .map(|(n, v)| {
                let vs: Vec<String> = v.iter().map(i64::to_string).collect();
                format!("{n}=[{}]", vs.join(","))
            })
            .collect();
        let cons: Vec<&str> = self.constraints.iter().map(|(w, _)| w.as_str()).collect();
        format!("{}|{}", params.join(";"), cons.join(";"))
    }
}

/// How to tune.
#[derive(Clone, Debug)]
pub struct Options {
    /// libtpu worker processes (parallel compiles).
    pub workers: usize,
    /// The cache directory (`<dir>/<generation>.json`); `None`: no cache.
    pub cache_dir: Option<PathBuf>,
    /// The static parameters not tuned, as they key the cache (`"eps=1e-6"`).
    pub static_params: String,
    /// A progress bar on stderr.
    pub progress: bool,
    /// Compile even when the cache has the key (and overwrite it).
    pub refresh: bool,
}

impl Default for Options {
    /// Two workers, the cache in `$TPU_KERNEL_TUNE_CACHE` (else none), progress on.
    fn default() -> Options {
        Options {
            workers: 2,
            cache_dir: std::env::var_os("TPU_KERNEL_TUNE_CACHE").map(PathBuf::from),
            static_params: String::new(),
            progress: true,
            refresh: false,
        }
    }
}

/// A configuration's fate.
#[derive(Clone, Debug)]
pub enum Outcome {
    /// Refused by our checks for the target before any compile (the error's text).
    Pruned(String),
    /// Compiled, but libtpu refused it (its error's first line), or aborted.
    Rejected(String),
    /// Compiled: the model's estimate, and libtpu's bundle total.
    Ranked { estimate: Estimate, bundles: u64 },
}

/// The result of a tuning run.
#[derive(Clone, Debug)]
pub struct Tuned {
    /// The cache key.
    pub key: String,
    pub target: Target,
    /// The lowest predicted cost.
    pub best: Config,
    /// The best's predicted cycles.
    pub best_cycles: f64,
    /// Every configuration the space held after its constraints, ranked ones first (cheapest first),
    /// then rejected, then pruned. Empty when answered from the cache.
    pub outcomes: Vec<(Config, Outcome)>,
    /// Configurations the space's constraints removed.
    pub constrained_out: usize,
    /// libtpu compiles this run made.
    pub compiles: usize,
    /// Answered from the cache (no build, no compile).
    pub from_cache: bool,
    /// The space tuned over (`Space::describe`).
    pub space: String,
}

impl Tuned {
    /// The ranked configurations, cheapest first, with their estimates.
    pub fn ranked(&self) -> impl Iterator<Item = (&Config, &Estimate)> {
        self.outcomes.iter().filter_map(|(c, o)| match o {
            Outcome::Ranked { estimate, .. } => Some((c, estimate)),
            _ => None,
        })
    }

    /// A table of the outcomes (ranked first).
    pub fn report(&self) -> String {
        let mut out = format!(
            "{} on {}: best {} ({:.0} cycles){}\n",
            self.key,
            self.target,
            self.best,
            self.best_cycles,
            if self.from_cache { " [cached]" } else { "" }
        );
        for (c, o) in &self.outcomes {
            out += &match o {
                Outcome::Ranked { estimate: e, bundles } => format!(
                    "  {c:<28} {:>12.0} cycles  {} iterations × {} bundles{}  (DMA {:.0}/step, {:.0}% of it moved over the grid; {bundles} bundles)\n",
                    e.cycles,
                    e.iterations,
                    e.body,
                    if e.dma_bound() { ", DMA-bound" } else { "" },
                    e.dma_step,
                    e.moved_share() * 100.0
                ),
                Outcome::Rejected(why) => format!("  {c:<28} rejected by libtpu: {why}\n"),
                Outcome::Pruned(why) => format!("  {c:<28} pruned: {why}\n"),
            };
        }
        out
    }
}

/// Grids with more steps than this are not walked for their copy pattern (the model then takes
/// every block to move every step).
const MAX_WALKED_STEPS: usize = 1 << 20;

/// What the pipeline copies on each step of `call`'s grid after the first ([`Copies`], what `tune`
/// hands the cost model): the Pallas block schedule the interpreter runs (`semantics::walk_grid`:
/// a block moves when its index changes) walked with nothing run, counting the bytes of the blocked
/// operands that are not their whole array (those are copied once). `None` when a map reads
/// scalar-prefetch data (the blocks are known only at run time) or cannot be evaluated, or the grid
/// has more than 2^20 steps.
pub fn copies(call: &PallasCall) -> Option<Copies> {
    use crate::index_map::IndexMap;
    use crate::semantics::schedule::{walk_grid, BlockEngine};

    /// Counts the bytes whose block changed on each step after the first.
    struct Counter<'k> {
        maps: Vec<Option<IndexMap<'k>>>,
        bytes: Vec<u64>,
        env: Vec<i64>,
        moved: u64,
        steps: Vec<u64>,
        first: bool,
    }
    impl BlockEngine for Counter<'_> {
        fn block_index(
            &mut self,
            i: usize,
            point: &[i64],
            idx: &mut Vec<i64>,
        ) -> crate::error::Result<()> {
            let map = self.maps[i]
                .as_ref()
                .expect("only blocked operands are asked");
            map.eval(point, &mut self.env, idx)
        }
        fn copy_in(&mut self, i: usize, _: usize, _: &[i64]) -> crate::error::Result<()> {
            self.moved += self.bytes[i];
            Ok(())
        }
        fn write_back(&mut self, _: usize, _: usize, _: &[i64]) -> crate::error::Result<()> {
            Ok(()) // counted when the next block starts (`start_output`)
        }
        fn start_output(&mut self, i: usize, _: usize, _: &[i64]) -> crate::error::Result<()> {
            self.moved += self.bytes[i];
            Ok(())
        }
        fn step(&mut self, _: &[i64]) -> crate::error::Result<()> {
            if !std::mem::replace(&mut self.first, false) {
                self.steps.push(self.moved);
            }
            self.moved = 0;
            Ok(())
        }
        fn cross(&mut self, _: &[i64], _: usize) -> crate::error::Result<()> {
            Ok(())
        }
    }

    let k = call.ir();
    let maps: Vec<Option<IndexMap<'_>>> = k
        .operands
        .iter()
        .map(|o| o.block.as_ref().map(|b| IndexMap::new(&b.index_map)))
        .collect();
    let steps: usize = k.grid.iter().product();
    if maps.iter().flatten().any(IndexMap::reads_data) || steps > MAX_WALKED_STEPS {
        return None;
    }
    // a block that is its whole array is copied once (`dma_once`), not in the pattern
    let bytes: Vec<u64> = k
        .operands
        .iter()
        .map(|o| match &o.block {
            Some(b) if b.block_shape != o.shape => {
                let elements: usize = b.block_shape.iter().product();
                (elements * o.dtype.vmem_bits() as usize).div_ceil(8) as u64
            }
            _ => 0,
        })
        .collect();
    let mut counter = Counter {
        maps,
        bytes,
        env: Vec::new(),
        moved: 0,
        steps: Vec::new(),
        first: true,
    };
    walk_grid(k, &[], &[], &mut counter).ok()?;
    Some(Copies::of_moved(counter.bytes.iter().sum(), counter.steps))
}

fn err(msg: String) -> KernelError {
    KernelError::new(ErrorKind::Unsupported, format!("tune: {msg}"))
}

/// The cache key: kernel, the input and output shapes and dtypes (of the first buildable
/// configuration: they do not depend on it) and the static parameters not tuned. The space is
/// recorded in the entry, not keyed: a later run over another space replaces it.
fn key(kernel: &str, call: &PallasCall, static_params: &str) -> String {
    let operands: Vec<String> = call
        .ir()
        .operands
        .iter()
        .filter(|o| o.role != crate::ir::OperandRole::Scratch) // scratch depends on the configuration
        .map(|o| {
            let dims: Vec<String> = o.shape.iter().map(usize::to_string).collect();
            format!("{} {}[{}]", o.label(), o.dtype, dims.join(","))
        })
        .collect();
    format!("{kernel}({})[{static_params}]", operands.join(", "))
}

fn cache_file(dir: &Path, target: Target) -> PathBuf {
    dir.join(format!("{}.json", target.name()))
}

fn read_cache(path: &Path) -> Map<String, Value> {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|t| serde_json::from_str::<Value>(&t).ok())
        .and_then(|v| v.as_object().cloned())
        .unwrap_or_default()
}

/// The cached best configuration of `key` on `target` tuned over `space` (`Space::describe`; `""`:
/// over any space), if any.
pub fn cached(dir: &Path, target: Target, key: &str, space: &str) -> Option<(Config, f64)> {
    let entry = read_cache(&cache_file(dir, target)).remove(key)?;
    if !space.is_empty() && entry["space"].as_str() != Some(space) {
        return None;
    }
    let best = entry["best"]
        .as_object()?
        .iter()
        .map(|(k, v)| Some((k.clone(), v.as_i64()?)))
        .collect::<Option<BTreeMap<_, _>>>()?;
    Some((Config(best), entry["cycles"].as_f64()?))
}

/// Tune `kernel` (a name for the key and reports) on `target` over `space`; `build` makes the launch
/// of one configuration (run inside `target.scope`, so the checks are the target's).
pub fn tune(
    kernel: &str,
    target: Target,
    space: &Space,
    options: &Options,
    build: impl Fn(&Config) -> Result<PallasCall, KernelError> + Sync,
) -> Result<Tuned, KernelError> {
    let (configs, constrained_out) = space.configs();
    if configs.is_empty() {
        return Err(err(format!(
            "the space of `{kernel}` is empty after its constraints ({})",
            space.describe()
        )));
    }
    // Build every configuration for the target: our checks prune before any compile.
    let built: Vec<(Config, Result<PallasCall, KernelError>)> = configs
        .into_iter()
        .map(|c| {
            let r = target.scope(|| build(&c));
            (c, r)
        })
        .collect();
    let Some(first) = built.iter().find_map(|(_, r)| r.as_ref().ok()) else {
        let why: Vec<String> = built
            .iter()
            .take(3)
            .map(|(c, r)| {
                format!(
                    "{c}: {}",
                    r.as_ref()
                        .err()
                        .map_or(String::new(), |e| e.message.clone())
                )
            })
            .collect();
        return Err(err(format!(
            "no configuration of `{kernel}` passes the checks for {target} (e.g. {})",
            why.join("; ")
        )));
    };
    let key = key(kernel, first, &options.static_params);
    if let (Some(dir), false) = (&options.cache_dir, options.refresh) {
        if let Some((best, cycles)) = cached(dir, target, &key, &space.describe()) {
            return Ok(Tuned {
                key,
                target,
                best,
                best_cycles: cycles,
                outcomes: Vec::new(),
                constrained_out,
                compiles: 0,
                from_cache: true,
                space: space.describe(),
            });
        }
    }
    let mut outcomes: Vec<(Config, Outcome)> = Vec::new();
    let mut jobs = Vec::new();
    let mut compiled_configs = Vec::new();
    for (c, r) in built {
        match r.and_then(|call| Ok((CustomCall::new(call.ir()).stablehlo()?, copies(&call)))) {
            Ok((hlo, pattern)) => {
                jobs.push(Job::new(hlo, target.name()));
                compiled_configs.push((c, pattern));
            }
            Err(e) => outcomes.push((c, Outcome::Pruned(e.message.clone()))),
        }
    }
    let compiler =
        Compiler::new_with_worker(options.workers, default_program()?)?.without_llo_counts();
    let bar = Progress::new(options.progress, jobs.len(), kernel, target);
    let results = compiler.compile_all(&jobs, &|done, total| bar.tick(done, total));
    let mut ranked = Vec::new();
    for ((c, pattern), r) in compiled_configs.into_iter().zip(results) {
        let v = r?;
        match (&v.schedule, v.ok) {
            // our kernels' grids are static: no axis is sized at run time
            (Some(s), true) => match cost::estimate(s, target, &[], pattern.as_ref()) {
                Ok(estimate) => ranked.push((
                    c,
                    Outcome::Ranked {
                        estimate,
                        bundles: v.bundles.unwrap_or(0),
                    },
                )),
                Err(why) => outcomes.push((c, Outcome::Rejected(why))),
            },
            (None, true) => outcomes.push((
                c,
                Outcome::Rejected("compiled, but libtpu wrote no schedule of the kernel".into()),
            )),
            _ => {
                let first = v
                    .error
                    .as_deref()
                    .and_then(|e| e.lines().find(|l| !l.trim().is_empty()))
                    .unwrap_or("")
                    .to_string();
                outcomes.push((c, Outcome::Rejected(first)))
            }
        }
    }
    let cycles = |o: &Outcome| match o {
        Outcome::Ranked { estimate, .. } => estimate.cycles,
        _ => f64::INFINITY,
    };
    ranked.sort_by(|a, b| cycles(&a.1).total_cmp(&cycles(&b.1)).then(a.0.cmp(&b.0)));
    let Some((best, best_o)) = ranked.first().cloned() else {
        return Err(err(format!(
            "no configuration of `{kernel}` compiled for {target}:\n{}",
            outcomes
                .iter()
                .map(|(c, o)| format!("  {c}: {o:?}"))
                .collect::<Vec<_>>()
                .join("\n")
        )));
    };
    let best_cycles = cycles(&best_o);
    let compiles = jobs.len();
    ranked.extend(outcomes);
    let tuned = Tuned {
        key,
        target,
        best,
        best_cycles,
        outcomes: ranked,
        constrained_out,
        compiles,
        from_cache: false,
        space: space.describe(),
    };
    if let Some(dir) = &options.cache_dir {
        store(dir, &tuned)?;
    }
    Ok(tuned)
}

/// The worker program of a tuning run: as `Compiler::new` finds it.
fn default_program() -> Result<Vec<std::ffi::OsString>, KernelError> {
    super::default_worker()
}

/// Write `tuned` into its generation's cache file (other keys kept).
fn store(dir: &Path, tuned: &Tuned) -> Result<(), KernelError> {
    std::fs::create_dir_all(dir).map_err(|e| err(format!("creating {}: {e}", dir.display())))?;
    let path = cache_file(dir, tuned.target);
    let mut all = read_cache(&path);
    let top: Vec<Value> = tuned
        .ranked()
        .take(5)
        .map(|(c, e)| json!({"config": c.0, "cycles": e.cycles}))
        .collect();
    all.insert(
        tuned.key.clone(),
        json!({
            "best": tuned.best.0,
            "cycles": tuned.best_cycles,
            "top": top,
            "compiles": tuned.compiles,
            "space": tuned.space,
            "model": "bundles x steps vs DMA (docs/tune.md)",
        }),
    );
    let text = serde_json::to_string_pretty(&Value::Object(all)).expect("JSON of JSON values");
    let tmp = path.with_extension("json.tmp");
    std::fs::write(&tmp, text)
        .and_then(|_| std::fs::rename(&tmp, &path))
        .map_err(|e| err(format!("writing {}: {e}", path.display())))
}

/// A progress bar on stderr: redrawn in place on a terminal, a line per tenth otherwise.
struct Progress {
    on: bool,
    tty: bool,
    label: String,
}

impl Progress {
    fn new(on: bool, total: usize, kernel: &str, target: Target) -> Progress {
        use std::io::IsTerminal;
        let p = Progress {
            on,
            tty: std::io::stderr().is_terminal(),
            label: format!("tune {kernel} for {target}"),
        };
        if on {
            eprintln!("{}: compiling {total} configurations", p.label);
        }
        p
    }

    fn tick(&self, done: usize, total: usize) {
        if !self.on || total == 0 {
            return;
        }
        let width = 30;
        let filled = done * width / total;
        let bar = format!(
            "{}: [{}{}] {done}/{total}",
            self.label,
            "#".repeat(filled),
            ".".repeat(width - filled)
        );
        if self.tty {
            eprint!("\r{bar}");
            if done == total {
                eprintln!();
            }
        } else if done == total || (done * 10 / total) != ((done - 1) * 10 / total) {
            eprintln!("{bar}");
        }
    }
}
