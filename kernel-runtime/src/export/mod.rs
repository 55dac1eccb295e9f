//! Kernels as a library other languages call: the registry a user crate's `export_library!` builds
//! from its `#[export]`ed launch functions and its host functions (`host`: plain Rust a caller runs
//! around a launch), the versioned C ABI over it (`abi`), and the XLA FFI handler that runs a kernel
//! on XLA's CPU buffers (`ffi`).
//!
//! A request names a kernel, its input array types, its static parameters (JSON) and any batch levels
//! (`jax.vmap`); the answer is the built kernel's output types, and on demand the `tpu_custom_call`
//! backend_config. Built kernels are cached per canonical request, so a signature is traced, checked,
//! lowered and serialized once per process.

pub mod abi;
pub mod ffi;
mod host;
mod params;
#[cfg(test)]
mod tests;

pub use host::{HostExport, HostFn};

/// The global allocator `export_library!` declares in a kernel library (unless `allocator = system`):
/// mimalloc, a heap of the library's own. A kernel library lives in a process whose `malloc` heap
/// XLA's compiles have left large and fragmented (hundreds of MB of free chunks); the interpreter
/// allocates per op (view paths, window segments, DMA records), and with glibc each allocation past
/// its thread cache searches those bins (measured: a decode step ~25% slower once an XLA program has
/// been compiled in the process; with this allocator the same as in a fresh one).
#[doc(hidden)]
pub use mimalloc::MiMalloc as KernelAllocator;
pub use params::{ParamSpec, StaticParam};

use crate::dtype::DType;
use crate::error::{kerr, panic_message, KernelError, Result, SourceLoc};
use crate::launch::{ArrayType, PallasCall};
use crate::serialize::CustomCall;
use crate::target::{Executor, Target};
use serde_json::{json, Map, Value};
use std::collections::HashMap;
use std::ffi::CString;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

/// The version of the C ABI (`abi`): bumped whenever a symbol, a method or a JSON field changes
/// meaning. The Python package refuses a library whose version differs from its own. (5: requests
/// and answers carry the TPU target; a library of 4 would ignore a request's target.)
pub const ABI_VERSION: u32 = 5;

/// How to compute a kernel's vector-Jacobian product with other exported kernels: call `kernel` with
/// the arrays named in `args` (forward inputs by name, `out`/`outN`, `g`/`gN` for cotangents) and the
/// static parameters `params` (backward name → forward name); its outputs are the cotangents of the
/// forward inputs named in `inputs`, in order.
#[derive(Clone, Debug, PartialEq)]
pub struct GradSpec {
    pub inputs: &'static [&'static str],
    pub kernel: &'static str,
    pub args: &'static [&'static str],
    pub params: &'static [(&'static str, &'static str)],
}

/// The launch function of an export: input array types and static parameters to a built kernel.
pub type LaunchFn = fn(&[ArrayType], &Params) -> Result<PallasCall>;

/// What `#[export]` implements on the type it puts beside a launch fn (named like it), so that
/// `export_library!` finds the export by whatever path reaches the fn.
#[doc(hidden)]
pub trait ExportedKernel {
    fn export() -> KernelExport;
}

/// The inputs a built kernel's outputs alias (`input_output_aliases`) must be the ones its
/// `#[export(mutates(..))]` declares (torch defines the op's mutations from the declaration, before
/// anything is built).
fn check_mutates(export: &KernelExport, call: &PallasCall) -> Result<()> {
    // Input operands in the launch function's array order when no scalar-prefetch operand precedes
    // them (then operand `i` is array parameter `i`); else only the count is checked.
    if call.kernel.scalar_prefetch > 0 {
        if call.kernel.aliases.len() != export.mutates.len() {
            return Err(kerr!(
                Signature,
                "kernel `{}` aliases {} inputs to outputs (`input_output_aliases`) but its `#[export]` declares `mutates(..)` of {}: name each aliased input",
                export.name,
                call.kernel.aliases.len(),
                export.mutates.len()
            )
            .at(export.location));
        }
        return Ok(());
    }
    let aliased: Vec<&str> = call
        .kernel
        .aliases
        .iter()
        .filter_map(|(i, _)| export.inputs.get(*i).copied())
        .collect();
    let declared = |n: &&str| export.mutates.contains(n);
    if let Some(n) = aliased.iter().find(|n| !declared(n)) {
        return Err(kerr!(
            Signature,
            "kernel `{}` aliases its input `{n}` to an output (`input_output_aliases`) but its `#[export]` does not say so: write `#[export(mutates({n}))]`, so that torch ops know they write `{n}`",
            export.name
        )
        .at(export.location));
    }
    if let Some(n) = export.mutates.iter().find(|n| !aliased.contains(n)) {
        return Err(kerr!(
            Signature,
            "kernel `{}` declares `mutates({n})` but its launch aliases no output to `{n}`: add `.input_output_aliases([({}, 0)])` or drop `{n}` from `mutates(..)`",
            export.name,
            export.inputs.iter().position(|i| i == n).unwrap_or(0)
        )
        .at(export.location));
    }
    Ok(())
}

/// One exported kernel, as `#[export]` declares it.
#[derive(Clone, Debug)]
pub struct KernelExport {
    pub name: &'static str,
    pub doc: &'static str,
    /// Where the launch function is written.
    pub location: SourceLoc,
    /// The array parameters' names, in order.
    pub inputs: &'static [&'static str],
    pub params: Vec<ParamSpec>,
    /// The exported kernel run instead of this one under differentiation (`#[export(fwd = ..)]`): same
    /// arrays and static parameters, this kernel's outputs first, then residuals for the backward
    /// kernels (named `outN` after this kernel's outputs in the gradient rules).
    pub fwd: Option<&'static str>,
    pub grad: Option<Vec<GradSpec>>,
    /// The array parameters whose buffers the kernel's outputs alias (`#[export(mutates(x))]`; the
    /// launch's `input_output_aliases`, checked equal when it is built): torch ops declare them
    /// mutated and write them.
    pub mutates: &'static [&'static str],
    pub launch: LaunchFn,
}

/// A kernel's static parameters, complete (defaults filled in) and checked against their types.
#[derive(Clone, Debug, PartialEq)]
pub struct Params {
    kernel: &'static str,
    values: Map<String, Value>,
}

impl Params {
    /// The parameter `name` as a `T` (what the generated launch shim calls).
    pub fn get<T: StaticParam>(&self, name: &str) -> Result<T> {
        let v = self.values.get(name).ok_or_else(|| {
            kerr!(
                Signature,
                "kernel `{}` has no static parameter `{name}`",
                self.kernel
            )
        })?;
        T::from_json(v).map_err(|e| {
            kerr!(
                Signature,
                "static parameter `{name}` of kernel `{}`: {e}",
                self.kernel
            )
            .for_argument(name)
        })
    }
    pub fn to_json(&self) -> Value {
        Value::Object(self.values.clone())
    }
}

/// One `jax.vmap` level: the batch size and, per input, whether it is batched.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct BatchLevel {
    pub size: usize,
    pub inputs: Vec<bool>,
}

/// A kernel built for one signature.
#[derive(Debug)]
pub struct Built {
    pub call: PallasCall,
    pub params: Params,
    pub outputs: Vec<ArrayType>,
    /// What the XLA FFI handler receives as its `request` attribute: kernel, params and batch levels
    /// (the shapes come with the buffers).
    pub ffi_request: String,
    backend_config: OnceLock<Result<String>>,
    /// The interpreter's plan of the kernel (made at its first CPU call).
    prepared: OnceLock<crate::interpret::Prepared>,
}

impl Built {
    /// The interpreter's plan of the kernel under `options`, made once.
    pub(crate) fn prepared(
        &self,
        options: &crate::interpret::InterpretOptions,
        stats: &Stats,
    ) -> &crate::interpret::Prepared {
        self.prepared.get_or_init(|| {
            stats.plans.fetch_add(1, Ordering::Relaxed);
            crate::interpret::Prepared::new(&self.call.kernel, options)
        })
    }

    /// The `tpu_custom_call` backend_config (lowered, verified and serialized once).
    pub fn backend_config(&self, stats: &Stats) -> Result<String> {
        self.backend_config
            .get_or_init(|| {
                stats.lowerings.fetch_add(1, Ordering::Relaxed);
                CustomCall::new(&self.call.kernel).backend_config()
            })
            .clone()
    }
}

/// Cache misses, for tests and benchmarks.
#[derive(Debug, Default)]
pub struct Stats {
    pub builds: AtomicU64,
    pub lowerings: AtomicU64,
    pub ffi_builds: AtomicU64,
    /// Interpreter plans made for built kernels (one per built kernel, at its first CPU call).
    pub plans: AtomicU64,
}

/// What a request asks to build.
#[derive(Clone, Debug, PartialEq)]
pub struct Request {
    pub kernel: String,
    /// Full input types, batch dimensions included.
    pub inputs: Vec<ArrayType>,
    pub params: Map<String, Value>,
    pub batch: Vec<BatchLevel>,
    /// The TPU generation to build for (`"target"`: a name or a jax device kind; absent: the default).
    /// A launch function that names none builds for it, and one that reads it (`target: Target`)
    /// receives it.
    pub target: Target,
    /// What runs the kernel (`"executor": "cpu"`; absent: a TPU). The FFI handler builds for the
    /// CPU: the launch function builds inside [`Executor::scope`].
    pub executor: Executor,
    /// The device mesh the call runs over (`"mesh": [[axis, size], ..]`, sent from inside a
    /// `jax.shard_map`): the launch function builds inside its [`crate::mesh::Mesh::scope`].
    pub mesh: Option<crate::mesh::Mesh>,
}

impl Request {
    /// Read `{"kernel", "inputs": [{"shape", "dtype"}], "params": {..}, "batch": [[size, [bool..]]..],
    /// "target"}`; `inputs` may be absent (the FFI handler takes them from the buffers).
    pub fn from_json(v: &Value) -> Result<Request> {
        let kernel = v
            .get("kernel")
            .and_then(Value::as_str)
            .ok_or_else(|| kerr!(Signature, "request without a kernel name: {v}"))?
            .to_string();
        let mut inputs = Vec::new();
        for (i, a) in v
            .get("inputs")
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or_default()
            .iter()
            .enumerate()
        {
            inputs.push(array_type(a).map_err(|e| e.for_argument(format!("array {i}")))?);
        }
        let params = match v.get("params") {
            None | Some(Value::Null) => Map::new(),
            Some(Value::Object(m)) => m.clone(),
            Some(other) => {
                return Err(kerr!(
                    Signature,
                    "static parameters must be a mapping, got {other}"
                ))
            }
        };
        let mut batch = Vec::new();
        for level in v
            .get("batch")
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or_default()
        {
            let size = level.get(0).and_then(Value::as_u64);
            // `[size, [is input i batched, ..]]`; a flag that is not a bool makes the level bad.
            let flags = level
                .get(1)
                .and_then(Value::as_array)
                .and_then(|f| f.iter().map(Value::as_bool).collect::<Option<Vec<_>>>());
            match (size, flags) {
                (Some(size), Some(inputs)) => batch.push(BatchLevel {
                    size: size as usize,
                    inputs,
                }),
                _ => return Err(kerr!(Signature, "bad batch level {level}")),
            }
        }
        let target = match v.get("target") {
            None | Some(Value::Null) => Target::DEFAULT,
            Some(Value::String(t)) => Target::parse(t)?,
            Some(other) => {
                return Err(kerr!(
                    Signature,
                    "the target must be a name such as \"v6e\", got {other}"
                ))
            }
        };
        let executor = match v.get("executor") {
            None | Some(Value::Null) => Some(Executor::Tpu),
            Some(Value::String(e)) => Executor::from_name(e),
            Some(_) => None,
        };
        let Some(executor) = executor else {
            let names: Vec<String> = Executor::ALL
                .iter()
                .map(|e| format!("\"{}\"", e.name()))
                .collect();
            return Err(kerr!(
                Signature,
                "the executor must be {}, got {}",
                names.join(" or "),
                v["executor"]
            ));
        };
        let mesh = match v.get("mesh") {
            None | Some(Value::Null) => None,
            Some(Value::Array(axes)) => {
                let axes = axes
                    .iter()
                    .map(|a| {
                        match (
                            a.get(0).and_then(Value::as_str),
                            a.get(1).and_then(Value::as_u64),
                        ) {
                            (Some(n), Some(s)) => Ok((n.to_string(), s as usize)),
                            _ => Err(kerr!(Signature, "a mesh axis is [name, size], got {a}")),
                        }
                    })
                    .collect::<Result<Vec<_>>>()?;
                Some(crate::mesh::Mesh::new(axes)?)
            }
            Some(other) => {
                return Err(kerr!(
                    Signature,
                    "the mesh must be a list of [axis, size], got {other}"
                ))
            }
        };
        Ok(Request {
            kernel,
            inputs,
            params,
            batch,
            target,
            executor,
            mesh,
        })
    }
}

fn array_type(v: &Value) -> Result<ArrayType> {
    let shape = v
        .get("shape")
        .and_then(Value::as_array)
        .and_then(|s| {
            s.iter()
                .map(|d| d.as_u64().map(|d| d as usize))
                .collect::<Option<Vec<_>>>()
        })
        .ok_or_else(|| {
            kerr!(
                Shape,
                "an array needs a shape of non-negative ints, got {v}"
            )
        })?;
    let name = v.get("dtype").and_then(Value::as_str).unwrap_or("?");
    let dtype = DType::from_name(name).ok_or_else(|| {
        kerr!(
            DType,
            "unsupported dtype `{name}`; kernels take f32, bf16, i32, i8, u8, u32 or bool arrays"
        )
    })?;
    Ok(ArrayType::new(shape, dtype))
}

fn array_json(a: &ArrayType) -> Value {
    json!({"shape": a.shape, "dtype": a.dtype.name()})
}

/// The kernels of one shared library, with the cache of what has been built.
pub struct Library {
    pub name: &'static str,
    pub kernels: Vec<KernelExport>,
    pub host: Vec<HostExport>,
    description: CString,
    cache: Mutex<HashMap<String, Arc<Built>>>,
    /// The FFI handler's own index: (request attribute, buffer types) → built kernel, so a call
    /// parses no JSON once its signature has run.
    ffi_cache: Mutex<HashMap<String, Arc<Built>>>,
    pub stats: Stats,
}

impl Library {
    pub fn new(name: &'static str, kernels: Vec<KernelExport>) -> Library {
        let description = describe(name, &kernels, &[], &problems(&kernels));
        Library {
            name,
            kernels,
            host: Vec::new(),
            description: CString::new(description).unwrap_or_default(),
            cache: Mutex::new(HashMap::new()),
            ffi_cache: Mutex::new(HashMap::new()),
            stats: Stats::default(),
        }
    }

    /// The library with these host functions (`export_library!(.., host = [..])`); two of one name
    /// are a problem of the library, refused when it is loaded.
    pub fn with_host(mut self, host: Vec<HostExport>) -> Library {
        let mut problems = problems(&self.kernels);
        for (i, f) in host.iter().enumerate() {
            if host[..i].iter().any(|g| g.name == f.name) {
                problems.push(format!(
                    "two host functions are named `{}` (export_library! names each after its Rust function)",
                    f.name
                ));
            }
        }
        let description = describe(self.name, &self.kernels, &host, &problems);
        self.description = CString::new(description).unwrap_or_default();
        self.host = host;
        self
    }

    /// Call the host function `function` on JSON arguments.
    pub fn call_host(&self, function: &str, args: &[Value]) -> Result<Value> {
        let f = self
            .host
            .iter()
            .find(|f| f.name == function)
            .ok_or_else(|| {
                let names: Vec<&str> = self.host.iter().map(|f| f.name).collect();
                kerr!(
                    Signature,
                    "library `{}` has no host function `{function}`; it exports {}",
                    self.name,
                    list_or_none(&names)
                )
            })?;
        f.call(args)
    }

    /// The XLA FFI target name the library's handler is registered under.
    pub fn ffi_target(&self) -> String {
        format!("tpu_kernel_{}", self.name)
    }

    /// The library description (JSON): ABI version, FFI target, every kernel's inputs, static
    /// parameters with types and defaults, gradient rules and the inputs it writes (`mutates`); every
    /// host function's argument types.
    pub fn description(&self) -> &CString {
        &self.description
    }

    pub fn kernel(&self, name: &str) -> Result<&KernelExport> {
        self.kernels.iter().find(|k| k.name == name).ok_or_else(|| {
            let names: Vec<&str> = self.kernels.iter().map(|k| k.name).collect();
            kerr!(
                Signature,
                "library `{}` has no kernel `{name}`; it exports {}",
                self.name,
                names.join(", ")
            )
        })
    }

    /// The kernel built for `req` (from the cache when this signature was built before).
    pub fn build(&self, req: &Request) -> Result<Arc<Built>> {
        let export = self.kernel(&req.kernel)?;
        let params = canonical_params(export, &req.params)?;
        let base = base_inputs(export, req)?;
        let batch: Vec<Value> = req
            .batch
            .iter()
            .map(|l| json!([l.size, l.inputs]))
            .collect();
        let mut ffi_request = json!({
            "kernel": export.name,
            "params": params.to_json(),
            "batch": batch,
            "target": req.target.name(),
        });
        if let Some(m) = &req.mesh {
            ffi_request["mesh"] = json!(m.axes());
        }
        if req.executor != Executor::Tpu {
            ffi_request["executor"] = json!(req.executor.name());
        }
        let ffi_request = ffi_request.to_string();
        let key = format!(
            "{ffi_request}{}",
            Value::Array(base.iter().map(array_json).collect())
        );
        if let Some(b) = self.lock().get(&key) {
            return Ok(Arc::clone(b));
        }
        self.stats.builds.fetch_add(1, Ordering::Relaxed);
        let launch = || {
            req.executor.scope(|| {
                req.target.scope(|| match &req.mesh {
                    Some(m) => m.clone().scope(|| (export.launch)(&base, &params)),
                    None => (export.launch)(&base, &params),
                })
            })
        };
        let call = catch_unwind(AssertUnwindSafe(launch)).unwrap_or_else(|p| {
            Err(kerr!(
                Trace,
                "the launch function of kernel `{}` panicked: {}",
                export.name,
                panic_message(&*p)
            )
            .at(export.location))
        })?;
        if call.target() != req.target {
            return Err(kerr!(
                Signature,
                "the launch function of kernel `{}` builds for {} (`.target(..)`) but the request is for {}; take the target as a parameter (`target: Target`) and pass it on",
                export.name,
                call.target(),
                req.target
            )
            .at(export.location));
        }
        check_mutates(export, &call)?;
        let mut call = call;
        for level in req.batch.iter().rev() {
            call = call.batched(level.size, &level.inputs)?;
        }
        let outputs = call
            .kernel
            .outputs()
            .map(|o| ArrayType::new(&o.shape, o.dtype))
            .collect();
        let built = Arc::new(Built {
            call,
            params,
            outputs,
            ffi_request,
            backend_config: OnceLock::new(),
            prepared: OnceLock::new(),
        });
        self.lock().insert(key, Arc::clone(&built));
        Ok(built)
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Arc<Built>>> {
        self.cache.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn ffi_cache(&self) -> MutexGuard<'_, HashMap<String, Arc<Built>>> {
        self.ffi_cache.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A kernel's static parameters in their canonical form: every parameter, from `given` or its
    /// default, each value read as its Rust type and written back (`eps: f32` given `1` is `1.0`).
    /// What callers key their caches on, so two spellings of one value are one kernel.
    pub fn canonical(&self, kernel: &str, given: &Map<String, Value>) -> Result<Params> {
        canonical_params(self.kernel(kernel)?, given)
    }

    /// Answer one C-ABI method call with a JSON value: `canonical` (a kernel's static parameters as
    /// Rust reads them), `build` (output types, canonical params, the FFI request), `lower` (also the
    /// `tpu_custom_call` backend_config), `host` (a host function's `result`), `stats` (cache misses),
    /// `ffi_layout` (the FFI structs as the handler lays them out).
    pub fn dispatch(&self, method: &str, request: &str) -> Value {
        let json = || -> Result<Value> {
            serde_json::from_str(request)
                .map_err(|e| kerr!(Signature, "request is not JSON ({e}): {request}"))
        };
        let parse = || Request::from_json(&json()?);
        let answer = || -> Result<Value> {
            match method {
                "ffi_layout" => {
                    // The handler's view of XLA's structs, for a test against the C header.
                    let layout: Map<String, Value> = ffi::layout()
                        .into_iter()
                        .map(|(k, v)| (k.to_string(), Value::from(v)))
                        .collect();
                    Ok(json!({"ok": true, "layout": layout, "api_version": [ffi::API_MAJOR, ffi::API_MINOR]}))
                }
                "stats" => Ok(json!({
                    "ok": true,
                    "builds": self.stats.builds.load(Ordering::Relaxed),
                    "lowerings": self.stats.lowerings.load(Ordering::Relaxed),
                    "ffi_builds": self.stats.ffi_builds.load(Ordering::Relaxed),
                    "plans": self.stats.plans.load(Ordering::Relaxed),
                })),
                "host" => {
                    // `{"function": name, "args": [..]}`
                    let v = json()?;
                    let (Some(function), Some(args)) = (
                        v.get("function").and_then(Value::as_str),
                        v.get("args").and_then(Value::as_array),
                    ) else {
                        return Err(kerr!(
                            Signature,
                            "a host call is {{\"function\": name, \"args\": [..]}}, got {v}"
                        ));
                    };
                    Ok(json!({"ok": true, "result": self.call_host(function, args)?}))
                }
                "canonical" => {
                    let req = parse()?;
                    let params = self.canonical(&req.kernel, &req.params)?;
                    Ok(json!({"ok": true, "params": params.to_json()}))
                }
                "build" | "lower" => {
                    let built = self.build(&parse()?)?;
                    let mut out = json!({
                        "ok": true,
                        "outputs": built.outputs.iter().map(array_json).collect::<Vec<_>>(),
                        "kernel_name": built.call.kernel.name,
                        "params": built.params.to_json(),
                        "target": built.call.target().name(),
                        "ffi_request": built.ffi_request,
                        "input_output_aliases": built.call.kernel.aliases,
                        "cost_estimate": built.call.kernel.cost_estimate.map(|c| json!({
                            "flops": c.flops,
                            "transcendentals": c.transcendentals,
                            "bytes_accessed": c.bytes_accessed,
                        })),
                    });
                    if method == "lower" {
                        out["backend_config"] = Value::String(built.backend_config(&self.stats)?);
                    }
                    Ok(out)
                }
                #[cfg(feature = "libtpu")]
                "libtpu_compile" => libtpu_abi::compile(&json()?),
                #[cfg(feature = "libtpu")]
                "libtpu_estimate" => libtpu_abi::estimate_stored(&json()?),
                #[cfg(feature = "libtpu")]
                "libtpu_serve" => libtpu_abi::serve(),
                other => Err(kerr!(
                    Unsupported,
                    "unknown method `{other}` (this library speaks ABI version {ABI_VERSION}: canonical, build, lower, host, stats, ffi_layout{})",
                    if cfg!(feature = "libtpu") { ", libtpu_compile, libtpu_estimate, libtpu_serve" } else { "" }
                )),
            }
        };
        answer().unwrap_or_else(|e| error_json(&e))
    }
}

/// libtpu through the C ABI (`kernel_runtime::libtpu`): what `tpu_kernel.libtpu` calls.
#[cfg(feature = "libtpu")]
mod libtpu_abi {
    use crate::error::Result;
    use crate::libtpu::{cost::Copies, Compiled, Compiler, Job};
    use serde_json::{json, Value};
    use std::collections::HashMap;
    use std::ffi::OsString;
    use std::sync::{Arc, Mutex, OnceLock};

    /// One pool per (worker program, size), kept for the process: its workers stay alive across
    /// calls (libtpu loads once per worker).
    type Pools = Mutex<HashMap<(Vec<OsString>, usize, bool), Arc<Compiler>>>;

    fn pool(program: Vec<OsString>, workers: usize, llo: bool) -> Result<Arc<Compiler>> {
        static POOLS: OnceLock<Pools> = OnceLock::new();
        let mut pools = POOLS
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let key = (program.clone(), workers, llo);
        if let Some(c) = pools.get(&key) {
            return Ok(Arc::clone(c));
        }
        let c = Compiler::new_with_worker(workers, program)?;
        let c = Arc::new(if llo { c } else { c.without_llo_counts() });
        pools.insert(key, Arc::clone(&c));
        Ok(c)
    }

    /// `{"jobs": [{"stablehlo", "topology", "num_replicas"?, "num_partitions"?, "trips"?, "copies"?}], "workers":
    /// n, "worker": [program, args..], "llo"?: false (no LLO op counts, no Mosaic dumps)}` →
    /// `{"ok": true, "results": [verdict | {"error": ..}]}`.
    pub(super) fn compile(v: &Value) -> Result<Value> {
        let refuse = |what: &str| {
            crate::error::KernelError::new(
                crate::error::ErrorKind::Signature,
                format!("libtpu_compile: {what}"),
            )
        };
        let program: Vec<OsString> = v["worker"]
            .as_array()
            .ok_or_else(|| refuse("`worker` must be [program, args..]"))?
            .iter()
            .map(|a| a.as_str().map(OsString::from))
            .collect::<Option<_>>()
            .ok_or_else(|| refuse("`worker` must hold strings"))?;
        let workers = v["workers"].as_u64().unwrap_or(1).max(1) as usize;
        // per job: trip counts of grid axes sized at run time and the copy pattern (`cost::estimate`)
        let mut trips: Vec<(Vec<u64>, Option<Copies>)> = Vec::new();
        let jobs = v["jobs"]
            .as_array()
            .ok_or_else(|| refuse("`jobs` must be a list"))?
            .iter()
            .map(|j| {
                let (Some(hlo), Some(topology)) = (j["stablehlo"].as_str(), j["topology"].as_str())
                else {
                    return Err(refuse("a job needs `stablehlo` and `topology` strings"));
                };
                let mut job = Job::new(hlo, topology);
                trips.push((trips_of(&j["trips"]), Copies::from_json(&j["copies"])));
                job.num_replicas = j["num_replicas"].as_u64().unwrap_or(1) as u32;
                job.num_partitions = j["num_partitions"].as_u64().unwrap_or(1) as u32;
                Ok(job)
            })
            .collect::<Result<Vec<Job>>>()?;
        let compiler = pool(program, workers, v["llo"].as_bool().unwrap_or(true))?;
        let results = compiler.compile_all(&jobs, &|_, _| {});
        Ok(json!({
            "ok": true,
            "library": compiler.library().display().to_string(),
            "results": results.into_iter().zip(&trips).map(|(r, (t, p))| match r {
                Ok(c) => verdict(&c, t, p.as_ref()),
                Err(e) => json!({"error": e.to_string()}),
            }).collect::<Vec<_>>(),
        }))
    }

    /// The model's estimate of `s` on `target`, or why there is none.
    fn estimate(
        s: &crate::libtpu::Schedule,
        target: crate::Target,
        trips: &[u64],
        copies: Option<&Copies>,
    ) -> (Value, Value) {
        match crate::libtpu::cost::estimate(s, target, trips, copies) {
            Ok(e) => (e.to_json(), Value::Null),
            Err(why) => (Value::Null, Value::String(why)),
        }
    }

    fn trips_of(v: &Value) -> Vec<u64> {
        v.as_array()
            .map(|t| t.iter().filter_map(Value::as_u64).collect())
            .unwrap_or_default()
    }

    /// `{"schedule", "generation", "trips"?, "copies"?}` → `{"ok": true, "estimate",
    /// "estimate_error"}`: the model on a stored schedule (a `compile` verdict's), with no compile.
    pub(super) fn estimate_stored(v: &Value) -> Result<Value> {
        let target = crate::Target::parse(v["generation"].as_str().unwrap_or(""))?;
        let s = crate::libtpu::Schedule::from_json(&v["schedule"]);
        let copies = Copies::from_json(&v["copies"]);
        let (estimate, estimate_error) =
            estimate(&s, target, &trips_of(&v["trips"]), copies.as_ref());
        Ok(json!({"ok": true, "estimate": estimate, "estimate_error": estimate_error}))
    }

    fn verdict(c: &Compiled, trips: &[u64], copies: Option<&Copies>) -> Value {
        let target = crate::Target::parse(c.topology.split(':').next().unwrap_or("")).ok();
        let (estimate, estimate_error) = match (&c.schedule, target) {
            (Some(s), Some(t)) => estimate(s, t, trips, copies),
            _ => (Value::Null, Value::Null),
        };
        let schedule = c.schedule.as_ref().map(crate::libtpu::Schedule::to_json);
        json!({
            "schedule": schedule,
            "estimate": estimate,
            "estimate_error": estimate_error,
            "topology": c.topology,
            "ok": c.ok,
            "aborted": c.aborted,
            "error": c.error,
            "compile_ms": c.compile_ms,
            "llo_counts": c.llo_counts,
            "llo_total": c.llo_total(),
            "bundles": c.bundles,
            "bundles_by_program": c.bundles_by_program,
            "used_vmem_bytes": c.used_vmem_bytes,
            "custom_calls": c.custom_calls,
            "rust_locations": c.rust_locations(),
        })
    }

    /// Become a worker (a process a `Compiler` started); never returns in one.
    pub(super) fn serve() -> Result<Value> {
        crate::libtpu::serve().map(|never| match never {})
    }
}

/// Names for a message: `a, b`, or `none`.
fn list_or_none<S: std::borrow::Borrow<str>>(names: &[S]) -> String {
    if names.is_empty() {
        "none".to_string()
    } else {
        names.join(", ")
    }
}

/// `{"ok": false, "error": {...}}` for a failed call.
pub fn error_json(e: &KernelError) -> Value {
    json!({
        "ok": false,
        "error": {
            "kind": format!("{:?}", e.kind),
            "message": e.message,
            "location": e.location.map(|l| l.to_string()),
            "argument": e.argument,
            "text": e.to_string(),
        }
    })
}

/// Every parameter of `export`, from the request or its default, checked against its type.
fn canonical_params(export: &KernelExport, given: &Map<String, Value>) -> Result<Params> {
    for name in given.keys() {
        if !export.params.iter().any(|p| p.name == name) {
            let known: Vec<String> = export
                .params
                .iter()
                .map(|p| format!("{}: {}", p.name, p.type_name))
                .collect();
            return Err(kerr!(
                Signature,
                "kernel `{}` has no static parameter `{name}`; its static parameters are: {}",
                export.name,
                list_or_none(&known)
            )
            .for_argument(name.as_str())
            .at(export.location));
        }
    }
    let mut values = Map::new();
    for p in &export.params {
        let v = match (given.get(p.name), &p.default) {
            (Some(v), _) => (p.canonical)(v).map_err(|e| {
                kerr!(
                    Signature,
                    "static parameter `{}` of kernel `{}` must be {}: {e}",
                    p.name,
                    export.name,
                    p.type_name
                )
                .for_argument(p.name)
                .at(export.location)
            })?,
            (None, Some(d)) => d.clone(),
            (None, None) => {
                return Err(kerr!(
                    Signature,
                    "kernel `{}` needs the static parameter `{}` ({}), which has no default",
                    export.name,
                    p.name,
                    p.type_name
                )
                .for_argument(p.name)
                .at(export.location))
            }
        };
        values.insert(p.name.to_string(), v);
    }
    Ok(Params {
        kernel: export.name,
        values,
    })
}

/// The kernel's own input types: the request's, with each batch level's leading dimension removed.
fn base_inputs(export: &KernelExport, req: &Request) -> Result<Vec<ArrayType>> {
    if req.inputs.len() != export.inputs.len() {
        return Err(kerr!(
            Signature,
            "kernel `{}` takes {} arrays ({}), got {}",
            export.name,
            export.inputs.len(),
            export.inputs.join(", "),
            req.inputs.len()
        )
        .at(export.location));
    }
    let mut base = req.inputs.clone();
    for (l, level) in req.batch.iter().enumerate() {
        if level.inputs.len() != base.len() {
            return Err(kerr!(
                Signature,
                "batch level {l} has {} flags for {} inputs",
                level.inputs.len(),
                base.len()
            ));
        }
        for (i, a) in base.iter_mut().enumerate() {
            if !level.inputs[i] {
                continue;
            }
            if a.shape.first() != Some(&level.size) {
                return Err(kerr!(
                    Shape,
                    "batched array `{}` of shape {:?} does not lead with the batch size {}",
                    export.inputs[i],
                    a.shape,
                    level.size
                ));
            }
            a.shape.remove(0);
        }
    }
    Ok(base)
}

/// What is wrong with the library as a whole (checked when it is made; `#[export]` checks each rule
/// against its own kernel at compile time, but the backward kernels are only known here): a gradient
/// rule naming a kernel the library does not export, passing it the wrong number of arrays, or a
/// static parameter it does not have.
pub fn problems(kernels: &[KernelExport]) -> Vec<String> {
    let mut out = Vec::new();
    for k in kernels {
        if let Some(fwd) = k.fwd {
            match kernels.iter().find(|b| b.name == fwd) {
                None => out.push(format!(
                    "{}: kernel `{}` runs `{fwd}` under differentiation, which this library does not export (list it in export_library!)",
                    k.location, k.name
                )),
                Some(b) => {
                    if b.inputs != k.inputs {
                        out.push(format!(
                            "{}: kernel `{}` runs `{fwd}` under differentiation, whose arrays ({}) are not its own ({})",
                            k.location,
                            k.name,
                            b.inputs.join(", "),
                            k.inputs.join(", ")
                        ));
                    }
                    let names = |x: &KernelExport| x.params.iter().map(|p| p.name).collect::<Vec<_>>();
                    if names(b) != names(k) {
                        out.push(format!(
                            "{}: kernel `{}` runs `{fwd}` under differentiation, whose static parameters ({}) are not its own ({})",
                            k.location,
                            k.name,
                            names(b).join(", "),
                            names(k).join(", ")
                        ));
                    }
                }
            }
        }
        for g in k.grad.iter().flatten() {
            let Some(b) = kernels.iter().find(|b| b.name == g.kernel) else {
                out.push(format!(
                    "{}: the gradient of kernel `{}` calls `{}`, which this library does not export (list it in export_library!)",
                    k.location, k.name, g.kernel
                ));
                continue;
            };
            if b.inputs.len() != g.args.len() {
                out.push(format!(
                    "{}: the gradient of kernel `{}` passes {} arrays to `{}`, which takes {} ({})",
                    k.location,
                    k.name,
                    g.args.len(),
                    b.name,
                    b.inputs.len(),
                    b.inputs.join(", ")
                ));
            }
            for (param, _) in g.params {
                if !b.params.iter().any(|p| p.name == *param) {
                    out.push(format!(
                        "{}: the gradient of kernel `{}` sets `{param}`, which `{}` does not take",
                        k.location, k.name, b.name
                    ));
                }
            }
        }
    }
    out
}

fn describe(
    name: &str,
    kernels: &[KernelExport],
    host: &[HostExport],
    problems: &[String],
) -> String {
    let ks: Vec<Value> = kernels
        .iter()
        .map(|k| {
            let params: Vec<Value> = k
                .params
                .iter()
                .map(|p| {
                    let mut o = json!({"name": p.name, "type": p.type_name});
                    if let Some(d) = &p.default {
                        o["default"] = d.clone();
                    }
                    o
                })
                .collect();
            let grad = k.grad.as_ref().map(|g| {
                g.iter()
                    .map(|e| {
                        json!({
                            "inputs": e.inputs,
                            "kernel": e.kernel,
                            "args": e.args,
                            "params": e.params.iter().map(|(b, f)| (b.to_string(), Value::from(*f))).collect::<Map<_, _>>(),
                        })
                    })
                    .collect::<Vec<_>>()
            });
            json!({
                "name": k.name,
                "doc": k.doc,
                "location": k.location.to_string(),
                "inputs": k.inputs,
                "params": params,
                "fwd": k.fwd,
                "grad": grad,
                "mutates": k.mutates,
            })
        })
        .collect();
    json!({
        "abi_version": ABI_VERSION,
        "library": name,
        "ffi_target": format!("tpu_kernel_{name}"),
        "kernels": ks,
        "host": host.iter().map(|f| json!({"name": f.name, "args": f.args})).collect::<Vec<_>>(),
        "problems": problems,
        // The dtype table (`crate::dtype::for_each_dtype!`): the Python side's dtype map.
        "dtypes": crate::dtype::DType::table_json(),
        "targets": targets_json(),
        "default_target": Target::DEFAULT.name(),
    })
    .to_string()
}

/// The launch shim's answer to a wrong number of arrays (the library checks first; this guards
/// direct calls of the shim).
pub fn arity_error(kernel: &str, want: usize, got: usize) -> KernelError {
    kerr!(
        Signature,
        "kernel `{kernel}` takes {want} arrays, got {got}"
    )
}

/// The target table as the library description carries it (for tools: the name, the topology
/// libtpu compiles it for, the jax device kinds that select it).
fn targets_json() -> Value {
    Target::ALL
        .iter()
        .map(|t| {
            let i = t.info();
            json!({"name": i.name, "topology": i.topology, "device_kinds": i.device_kinds})
        })
        .collect()
}
