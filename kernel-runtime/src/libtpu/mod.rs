//! libtpu from Rust, no Python: compile a StableHLO program (ours — `serialize::CustomCall::stablehlo`
//! — or any other that calls `tpu_custom_call`) for a TPU topology with no TPU and no PJRT client, and
//! read back libtpu's verdict, its error text (with the Rust source lines it names), the final LLO op
//! counts, the scheduled bundles of the kernel's program and the VMEM libtpu reserved.
//!
//! How: libtpu's PJRT C API (`GetPjrtApi` → `PJRT_TopologyDescription_Create` → `PJRT_Compile`, see
//! `pjrt`), in **worker processes** ([`Compiler`]): libtpu reads its flags once per process (the dump
//! directories we count from), and it aborts the process on some inputs (a CHECK failure), so it never
//! runs in the caller's. A worker stays alive across compiles; one that dies is reported as a verdict
//! (`Compiled::aborted`, libtpu's last words quoted) and replaced for the next compile.
//!
//! The worker is an executable run in worker mode: the program given to [`Compiler::new_with_worker`], else
//! `$TPU_KERNEL_LIBTPU_WORKER_BIN`, else this very executable when it called [`serve_if_worker`] at the
//! top of its `main` (tpu-kernel's example binaries do), else `tpu-kernel-libtpu-worker` beside it or
//! one directory up (cargo's `target/<profile>/` for `examples/` and `deps/` binaries).
//!
//! The library: `$TPU_LIBRARY_PATH` (libtpu's own variable), else the `libtpu` package of the active
//! Python environment (`$VIRTUAL_ENV`, else a `.venv` in the working directory or one above it).
//! What this relies on of libtpu (slots, flags, dump files), measured: `docs/libtpu.md`.

pub mod cost;
mod dumps;
mod pjrt;
mod schedule;
pub mod tune;
mod worker;

pub use schedule::Schedule;

use crate::error::{ErrorKind, KernelError};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

/// libtpu's verdict on one program for one topology.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Compiled {
    /// The topology compiled for (`v6e:1x1`, ...).
    pub topology: String,
    pub ok: bool,
    /// libtpu's error text when it rejected the program (or its last words when it aborted).
    pub error: Option<String>,
    /// The worker died while compiling (libtpu aborted the process; `error` quotes its log).
    pub aborted: bool,
    /// Wall time of `PJRT_Compile` in the worker.
    pub compile_ms: f64,
    /// `llo.*` ops of the final Mosaic stage (`post-finalize-llo`), by op; `None` when there was none.
    pub llo_counts: Option<BTreeMap<String, u64>>,
    /// Total scheduled bundles of the `tpu_custom_call` programs (their final VLIW schedules, a loop
    /// body counted once); `None` when one of them has no schedule dump.
    pub bundles: Option<u64>,
    /// Every program of the compiled module but the runtime's (TLP, `<late-...>`) → its bundles.
    pub bundles_by_program: BTreeMap<String, u64>,
    /// The VMEM libtpu reserved for the kernel (`used_scoped_memory_configs`, the largest of the
    /// module's custom calls).
    pub used_vmem_bytes: Option<u64>,
    /// How many `tpu_custom_call`s the optimized module holds.
    pub custom_calls: usize,
    /// The final schedule of the `tpu_custom_call` program(s) (several are merged: bundles by depth
    /// and DMA bytes added, the first's grid): what the cost model (`cost`) reads.
    pub schedule: Option<Schedule>,
}

impl Compiled {
    /// Total `llo.*` ops of the final Mosaic stage.
    pub fn llo_total(&self) -> Option<u64> {
        self.llo_counts.as_ref().map(|c| c.values().sum())
    }

    /// The Rust source locations (`file.rs:line:col`) libtpu's error text names: our ops carry them
    /// into the Mosaic module, and libtpu quotes them when it rejects one.
    pub fn rust_locations(&self) -> Vec<(String, u32, u32)> {
        rust_locations(self.error.as_deref().unwrap_or(""))
    }

    /// One line: the verdict and the counts.
    pub fn summary(&self) -> String {
        if !self.ok {
            let first = self
                .error
                .as_deref()
                .and_then(|e| e.lines().find(|l| !l.trim().is_empty()))
                .unwrap_or("");
            let what = if self.aborted { "ABORTED" } else { "REJECTED" };
            return format!("{}: {what}: {first}", self.topology);
        }
        let show = |v: Option<u64>| v.map_or("?".to_string(), |v| v.to_string());
        format!(
            "{}: ok, {} LLO ops, {} scheduled bundles, VMEM used {}",
            self.topology,
            show(self.llo_total()),
            show(self.bundles),
            show(self.used_vmem_bytes)
        )
    }
}

/// `file.rs:line:col` locations in a toolchain message, each once, in order.
pub fn rust_locations(msg: &str) -> Vec<(String, u32, u32)> {
    let mut out: Vec<(String, u32, u32)> = Vec::new();
    for (i, _) in msg.match_indices(".rs") {
        let after = &msg[i + 3..];
        let Some(nums) = after
            .strip_prefix("\":")
            .or_else(|| after.strip_prefix(':'))
        else {
            continue;
        };
        let start = msg[..i]
            .rfind(|c: char| c.is_whitespace() || "\"'()".contains(c))
            .map_or(0, |j| j + 1);
        let path = &msg[start..i + 3];
        let mut parts = nums.splitn(3, ':');
        let line = parts.next().and_then(|n| n.parse().ok());
        let col = parts.next().and_then(|n| {
            let digits = n.bytes().take_while(u8::is_ascii_digit).count();
            n[..digits].parse().ok()
        });
        if let (Some(line), Some(col), false) = (line, col, path.len() <= 3) {
            let loc = (path.to_string(), line, col);
            if !out.contains(&loc) {
                out.push(loc);
            }
        }
    }
    out
}

/// Each generation's smallest topology libtpu compiles for (`v4`/`v5p` have no 1x1; `tpu7x:1x1x1` is
/// one chip of two TensorCores). A topology name (`v5e:2x2`) passes through.
pub fn topology_of(generation: &str) -> String {
    if generation.contains(':') {
        return generation.to_string();
    }
    match crate::Target::parse(generation) {
        Ok(t) => t.info().topology.to_string(),
        Err(_) => format!("{generation}:1x1"),
    }
}

static SERVES: AtomicBool = AtomicBool::new(false);

/// Call first thing in `main`: in a worker process (started by a [`Compiler`] of another process) this
/// serves compiles and never returns; otherwise it returns at once, and this executable becomes the
/// default worker program of this process's compilers.
pub fn serve_if_worker() {
    if std::env::var_os(worker::WORKER_ENV).is_some() {
        worker::serve();
    }
    SERVES.store(true, Ordering::Relaxed);
}

/// Serve as a worker (the body of the `tpu-kernel-libtpu-worker` binary, and of a Python process
/// started to be one): errors if this process was not started by a [`Compiler`].
pub fn serve() -> Result<std::convert::Infallible, KernelError> {
    if std::env::var_os(worker::WORKER_ENV).is_none() {
        return Err(infra(format!(
            "this is tpu-kernel's libtpu worker: a Compiler starts it (with {} set); it is not run by hand",
            worker::WORKER_ENV
        )));
    }
    worker::serve()
}

fn infra(msg: String) -> KernelError {
    KernelError::new(ErrorKind::Unsupported, format!("libtpu: {msg}"))
}

/// Where libtpu's shared library is: `$TPU_LIBRARY_PATH`, else the `libtpu` package of the active
/// Python environment (`$VIRTUAL_ENV`, else `.venv` in the working directory or above it).
pub fn find_library() -> Result<PathBuf, KernelError> {
    if let Some(p) = std::env::var_os("TPU_LIBRARY_PATH") {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(infra(format!(
                "TPU_LIBRARY_PATH is {}, which is not a file",
                p.display()
            )))
        };
    }
    let mut envs: Vec<PathBuf> = std::env::var_os("VIRTUAL_ENV")
        .map(PathBuf::from)
        .into_iter()
        .collect();
    if let Ok(cwd) = std::env::current_dir() {
        envs.extend(
            cwd.ancestors()
                .map(|d| d.join(".venv"))
                .filter(|d| d.is_dir()),
        );
    }
    for env in &envs {
        for lib in ["lib", "lib64"] {
            let Ok(entries) = std::fs::read_dir(env.join(lib)) else {
                continue;
            };
            for e in entries.flatten() {
                let so = e.path().join("site-packages/libtpu/libtpu.so");
                if e.file_name().to_string_lossy().starts_with("python") && so.is_file() {
                    return Ok(so);
                }
            }
        }
    }
    Err(infra(format!(
        "libtpu's shared library not found: set TPU_LIBRARY_PATH to libtpu.so, or activate a Python \
         environment with the `libtpu` package (looked in: {})",
        if envs.is_empty() {
            "no $VIRTUAL_ENV and no .venv here or above".to_string()
        } else {
            envs.iter()
                .map(|e| e.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        }
    )))
}

/// The default worker program (see the module docs).
pub(crate) fn default_worker() -> Result<Vec<OsString>, KernelError> {
    if let Some(p) = std::env::var_os("TPU_KERNEL_LIBTPU_WORKER_BIN") {
        return Ok(vec![p]);
    }
    let exe =
        std::env::current_exe().map_err(|e| infra(format!("cannot find this executable: {e}")))?;
    if SERVES.load(Ordering::Relaxed) {
        return Ok(vec![exe.into()]);
    }
    let name = format!("tpu-kernel-libtpu-worker{}", std::env::consts::EXE_SUFFIX);
    for dir in exe.ancestors().skip(1).take(2) {
        let cand = dir.join(&name);
        if cand.is_file() {
            return Ok(vec![cand.into()]);
        }
    }
    Err(infra(format!(
        "no worker program: this executable ({}) did not call `kernel_runtime::libtpu::serve_if_worker()` \
         in main, there is no {name} beside it, and TPU_KERNEL_LIBTPU_WORKER_BIN is not set \
         (build the worker with `cargo build -p tpu-kernel --features libtpu --bin tpu-kernel-libtpu-worker`)",
        exe.display()
    )))
}

/// One program to compile.
#[derive(Clone, Debug)]
pub struct Job {
    /// StableHLO (MLIR text) of the program.
    pub stablehlo: String,
    /// A topology (`v6e:1x1`) or a generation (`v6e`, its smallest topology).
    pub topology: String,
    pub num_replicas: u32,
    pub num_partitions: u32,
}

impl Job {
    pub fn new(stablehlo: impl Into<String>, topology: &str) -> Job {
        Job {
            stablehlo: stablehlo.into(),
            topology: topology_of(topology),
            num_replicas: 1,
            num_partitions: 1,
        }
    }
}

/// A pool of libtpu worker processes (started on demand, at most `workers` at once, kept alive across
/// compiles, replaced when one dies). Compiles from several threads run in parallel, one per worker.
pub struct Compiler {
    library: PathBuf,
    program: Vec<OsString>,
    max: usize,
    timeout: Option<Duration>,
    /// Dump every Mosaic stage (for the LLO op counts). Large kernels write hundreds of MB of them.
    llo_counts: bool,
    idle: Mutex<(Vec<Worker>, usize)>,
    freed: Condvar,
}

struct Worker {
    child: Child,
    stdin: ChildStdin,
    replies: Receiver<String>,
    dirs: dumps::DumpDirs,
    log: PathBuf,
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dirs.root);
    }
}

impl Compiler {
    /// A pool of up to `workers` processes (at least one), with the library and worker program found
    /// as the module docs say.
    pub fn new(workers: usize) -> Result<Compiler, KernelError> {
        Compiler::new_with_worker(workers, default_worker()?)
    }

    /// A pool whose workers run `program` (an executable and its arguments).
    pub fn new_with_worker(
        workers: usize,
        program: Vec<OsString>,
    ) -> Result<Compiler, KernelError> {
        Ok(Compiler {
            library: find_library()?,
            program,
            max: workers.max(1),
            timeout: None,
            llo_counts: true,
            idle: Mutex::new((Vec::new(), 0)),
            freed: Condvar::new(),
        })
    }

    /// Compile with this library instead.
    pub fn with_library(mut self, library: PathBuf) -> Compiler {
        self.library = library;
        self
    }

    /// Give up on a compile after `timeout` (the worker is killed; the verdict says so).
    pub fn with_timeout(mut self, timeout: Duration) -> Compiler {
        self.timeout = Some(timeout);
        self
    }

    /// Without LLO op counts (`Compiled::llo_counts` is `None`): libtpu writes no Mosaic stage
    /// dumps, which for a large kernel take longer than its compile. What `tune` needs is the
    /// schedule alone.
    pub fn without_llo_counts(mut self) -> Compiler {
        self.llo_counts = false;
        self
    }

    /// The shared library the workers load.
    pub fn library(&self) -> &Path {
        &self.library
    }

    /// The largest number of workers this pool runs at once.
    pub fn workers(&self) -> usize {
        self.max
    }

    /// Compile `stablehlo` for `topology` (or a generation's topology). `Err` only when the worker could
    /// not run; libtpu's rejections and aborts are verdicts (`Compiled::ok` false).
    pub fn compile(&self, stablehlo: &str, topology: &str) -> Result<Compiled, KernelError> {
        self.run(&Job::new(stablehlo, topology))
    }

    /// Compile every job, in parallel on the pool's workers; results in the jobs' order. `progress` is
    /// called after each compile with (done, total).
    pub fn compile_all(
        &self,
        jobs: &[Job],
        progress: &(dyn Fn(usize, usize) + Sync),
    ) -> Vec<Result<Compiled, KernelError>> {
        let next = AtomicUsize::new(0);
        let done = AtomicUsize::new(0);
        let results: Vec<Mutex<Option<Result<Compiled, KernelError>>>> =
            jobs.iter().map(|_| Mutex::new(None)).collect();
        std::thread::scope(|s| {
            for _ in 0..self.max.min(jobs.len()) {
                s.spawn(|| loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(job) = jobs.get(i) else { break };
                    let r = self.run(job);
                    *results[i].lock().unwrap_or_else(|p| p.into_inner()) = Some(r);
                    progress(done.fetch_add(1, Ordering::Relaxed) + 1, jobs.len());
                });
            }
        });
        results
            .into_iter()
            .map(|m| {
                m.into_inner()
                    .unwrap_or_else(|p| p.into_inner())
                    .expect("every job ran")
            })
            .collect()
    }

    /// Compile one job on a free worker (starting one if the pool has room).
    pub fn run(&self, job: &Job) -> Result<Compiled, KernelError> {
        let mut worker = self.take()?;
        let result = self.ask(&mut worker, job);
        match result {
            Ok((compiled, alive)) => {
                self.give_back(alive.then_some(worker));
                Ok(compiled)
            }
            Err(e) => {
                self.give_back(None);
                Err(e)
            }
        }
    }

    fn take(&self) -> Result<Worker, KernelError> {
        let mut g = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(w) = g.0.pop() {
                return Ok(w);
            }
            if g.1 < self.max {
                g.1 += 1;
                drop(g);
                let started = self.start();
                if started.is_err() {
                    self.give_back(None);
                }
                return started;
            }
            g = self.freed.wait(g).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Return a worker to the pool (`None`: it is gone, its place is free).
    fn give_back(&self, worker: Option<Worker>) {
        let mut g = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        match worker {
            Some(w) => g.0.push(w),
            None => g.1 -= 1,
        }
        self.freed.notify_one();
    }

    fn start(&self) -> Result<Worker, KernelError> {
        // One number per worker of the process (not of the pool): two pools' workers never share dumps.
        static SERIAL: AtomicUsize = AtomicUsize::new(0);
        let n = SERIAL.fetch_add(1, Ordering::Relaxed);
        let root =
            std::env::temp_dir().join(format!("tpu-kernel-libtpu-{}-{n}", std::process::id()));
        let dirs = dumps::DumpDirs { root };
        dirs.create()
            .map_err(|e| infra(format!("creating {}: {e}", dirs.root.display())))?;
        let log = dirs.root.join("worker.log");
        let log_file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .map_err(|e| infra(format!("creating {}: {e}", log.display())))?;
        // Our dump flags replace any the caller's LIBTPU_INIT_ARGS has; the rest of it is kept.
        let ours = [
            "xla_mosaic_dump_to",
            "xla_jf_dump_to",
            "xla_jf_dump_llo_pass_label_regex",
        ];
        let mut init: Vec<String> = std::env::var("LIBTPU_INIT_ARGS")
            .unwrap_or_default()
            .split_whitespace()
            .filter(|a| !ours.iter().any(|o| a.contains(o)))
            .map(str::to_string)
            .collect();
        init.extend(dirs.init_args(self.llo_counts));
        let (exe, args) = self
            .program
            .split_first()
            .ok_or_else(|| infra("the worker program is empty".to_string()))?;
        let mut child = Command::new(exe)
            .args(args)
            .env(worker::WORKER_ENV, "1")
            .env(worker::LIBRARY_ENV, &self.library)
            .env(worker::DUMPS_ENV, &dirs.root)
            .env("LIBTPU_INIT_ARGS", init.join(" "))
            // Only our dump flags: XLA aborts on a flag it does not know (the caller's may be for the
            // CPU client), and libtpu reads XLA_FLAGS.
            .env("XLA_FLAGS", dirs.xla_flags())
            // Several processes may hold libtpu at once (compile only); without a TPU host's metadata
            // server, libtpu would otherwise retry it for half a minute before it starts.
            .env("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
            .env("TPU_SKIP_MDS_QUERY", "1")
            .env("TPU_ACCELERATOR_TYPE", "")
            .env("TF_CPP_MIN_LOG_LEVEL", "2")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log_file))
            .spawn()
            .map_err(|e| {
                infra(format!(
                    "cannot start the worker {}: {e}",
                    Path::new(exe).display()
                ))
            })?;
        let stdin = child.stdin.take().expect("piped");
        let stdout = child.stdout.take().expect("piped");
        let (tx, replies) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut w = Worker {
            child,
            stdin,
            replies,
            dirs,
            log,
        };
        // The hello: the library loaded (or why not). Loading takes about a second.
        let hello = match w.replies.recv_timeout(Duration::from_secs(300)) {
            Ok(line) => serde_json::from_str::<Value>(&line).unwrap_or(Value::Null),
            Err(_) => {
                let _ = w.child.kill();
                let status = w.child.wait().ok();
                return Err(infra(format!(
                    "the worker {} did not start ({}){}",
                    Path::new(exe).display(),
                    status.map_or("no status".to_string(), |s| s.to_string()),
                    quote_log(&w.log)
                )));
            }
        };
        if hello["ready"] != json!(true) {
            return Err(infra(format!(
                "the worker could not load {}: {}",
                self.library.display(),
                hello["error"].as_str().unwrap_or("no reason given")
            )));
        }
        Ok(w)
    }

    /// Send one job to `w` and read its verdict; the bool says whether the worker is still usable.
    fn ask(&self, w: &mut Worker, job: &Job) -> Result<(Compiled, bool), KernelError> {
        let _ = std::fs::OpenOptions::new()
            .write(true)
            .open(&w.log)
            .and_then(|f| f.set_len(0));
        let mut line = json!({
            "topology": job.topology,
            "stablehlo": job.stablehlo,
            "num_replicas": job.num_replicas,
            "num_partitions": job.num_partitions,
        })
        .to_string();
        line.push('\n');
        let mut compiled = Compiled {
            topology: job.topology.clone(),
            ..Compiled::default()
        };
        let sent = w
            .stdin
            .write_all(line.as_bytes())
            .and_then(|_| w.stdin.flush());
        let reply = match (sent, self.timeout) {
            (Err(_), _) => Err(RecvTimeoutError::Disconnected),
            (Ok(()), Some(t)) => w.replies.recv_timeout(t),
            (Ok(()), None) => w.replies.recv().map_err(|_| RecvTimeoutError::Disconnected),
        };
        let line = match reply {
            Ok(line) => line,
            Err(RecvTimeoutError::Timeout) => {
                let _ = w.child.kill();
                let _ = w.child.wait();
                compiled.error = Some(format!(
                    "libtpu took longer than {:?}: the compile was stopped",
                    self.timeout.unwrap_or_default()
                ));
                return Ok((compiled, false));
            }
            Err(RecvTimeoutError::Disconnected) => {
                let status = w.child.wait().ok();
                compiled.aborted = true;
                compiled.error = Some(format!(
                    "libtpu aborted the worker process ({}) while compiling for {}{}",
                    status.map_or("no status".to_string(), |s| s.to_string()),
                    job.topology,
                    quote_log(&w.log)
                ));
                return Ok((compiled, false));
            }
        };
        let v: Value = serde_json::from_str(&line)
            .map_err(|e| infra(format!("the worker's reply is not JSON ({e}): {line}")))?;
        if let Some(refused) = v["refused"].as_str() {
            return Err(infra(refused.to_string()));
        }
        compiled.ok = v["ok"] == json!(true);
        compiled.error = v["error"].as_str().map(str::to_string);
        compiled.compile_ms = v["compile_ms"].as_f64().unwrap_or(0.0);
        let counts = |v: &Value| -> BTreeMap<String, u64> {
            v.as_object()
                .map(|o| {
                    o.iter()
                        .filter_map(|(k, n)| Some((k.clone(), n.as_u64()?)))
                        .collect()
                })
                .unwrap_or_default()
        };
        compiled.llo_counts = v["llo_counts"]
            .is_object()
            .then(|| counts(&v["llo_counts"]));
        compiled.bundles_by_program = counts(&v["bundles_by_program"]);
        let calls: Vec<&str> = v["custom_calls"]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        compiled.custom_calls = calls.len();
        if compiled.ok && !calls.is_empty() {
            compiled.bundles = calls
                .iter()
                .map(|c| compiled.bundles_by_program.get(*c).copied())
                .sum();
        }
        if compiled.ok && !calls.is_empty() {
            let schedules: BTreeMap<&str, Schedule> = v["schedules"]
                .as_object()
                .map(|m| {
                    m.iter()
                        .map(|(k, s)| (k.as_str(), Schedule::from_json(s)))
                        .collect()
                })
                .unwrap_or_default();
            let mut merged: Option<Schedule> = None;
            for c in &calls {
                let Some(one) = schedules.get(c) else {
                    merged = None;
                    break;
                };
                match &mut merged {
                    None => merged = Some(one.clone()),
                    Some(m) => m.merge(one),
                }
            }
            if let Some(m) = &mut merged {
                // the XLA ops around the kernel (pads, slices, fusions): the rest of the module
                m.around_weighted = schedules
                    .iter()
                    .filter(|(p, _)| !calls.contains(p))
                    .map(|(_, s)| s.weighted_total())
                    .sum();
            }
            compiled.schedule = merged;
        }
        compiled.used_vmem_bytes = v["used_vmem"]
            .as_array()
            .and_then(|a| a.iter().filter_map(Value::as_u64).max());
        Ok((compiled, true))
    }
}

/// The end of a dead worker's log: libtpu's last words (the CHECK that failed, its fatal line).
fn quote_log(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.contains("Source Location Trace"))
        .collect();
    let fatal: Vec<&str> = lines
        .iter()
        .copied()
        .filter(|l| {
            l.contains("Check failed")
                || l.starts_with('F')
                || l.contains("Operation not supported")
                || l.contains("terminate called")
        })
        .collect();
    let pick = if fatal.is_empty() {
        &lines[lines.len().saturating_sub(8)..]
    } else {
        &fatal[fatal.len().saturating_sub(8)..]
    };
    if pick.is_empty() {
        String::new()
    } else {
        format!(":\n{}", pick.join("\n"))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn rust_locations_are_found_in_messages() {
        let msg =
            "error: loc(\"examples/add.rs\":12:5): bad\n at /src/x.rs:3:9 and examples/add.rs:12:5";
        assert_eq!(
            super::rust_locations(msg),
            [
                ("examples/add.rs".to_string(), 12, 5),
                ("/src/x.rs".to_string(), 3, 9)
            ]
        );
    }
}
