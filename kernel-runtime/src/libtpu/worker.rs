//! One worker process: libtpu loaded once, compiling request after request. The parent speaks to it
//! in lines of JSON — requests on the worker's stdin, replies on the file descriptor that was its
//! stdout (the worker points its own stdout at stderr first, so nothing libtpu prints can corrupt a
//! reply). libtpu's log goes to stderr, which the parent keeps in a file to quote when the worker
//! dies (libtpu aborts the process on some inputs: a CHECK failure).

use super::dumps::{self, DumpDirs};
use super::pjrt::{self, Api};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::io::{BufRead, Write};

/// The environment variable that puts a process in worker mode (set by the parent, never by hand).
pub(crate) const WORKER_ENV: &str = "TPU_KERNEL_LIBTPU_WORKER";
/// The library the worker loads (the parent found it).
pub(crate) const LIBRARY_ENV: &str = "TPU_KERNEL_LIBTPU_LIBRARY";
/// The worker's dump root (the parent made it and removes it).
pub(crate) const DUMPS_ENV: &str = "TPU_KERNEL_LIBTPU_DUMPS";

/// The worker's main loop; returns when stdin closes. Runs only in a worker process.
pub(crate) fn serve() -> ! {
    let code = match serve_inner() {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("tpu-kernel libtpu worker: {e}");
            3
        }
    };
    std::process::exit(code)
}

fn serve_inner() -> Result<(), String> {
    let mut out = take_stdout()?;
    let library = std::env::var_os(LIBRARY_ENV).ok_or(format!("{LIBRARY_ENV} is not set"))?;
    let dirs = DumpDirs {
        root: std::env::var_os(DUMPS_ENV)
            .ok_or(format!("{DUMPS_ENV} is not set"))?
            .into(),
    };
    let hello = match Api::load(std::path::Path::new(&library)) {
        Ok(api) => {
            let api: &'static Api = Box::leak(Box::new(api));
            reply(
                &mut out,
                &json!({"ready": true, "pjrt_api": format!("{}.{}", api.version.0, api.version.1)}),
            )?;
            Some(api)
        }
        Err(e) => {
            reply(&mut out, &json!({"ready": false, "error": e}))?;
            None
        }
    };
    let Some(api) = hello else { return Ok(()) };
    let mut topologies = HashMap::new();
    for line in std::io::stdin().lock().lines() {
        let line = line.map_err(|e| format!("reading a request: {e}"))?;
        let request: Value =
            serde_json::from_str(&line).map_err(|e| format!("a request is not JSON: {e}"))?;
        let answer = compile(api, &mut topologies, &dirs, &request);
        reply(&mut out, &answer)?;
    }
    Ok(())
}

/// The reply channel: the process's stdout as it was given, with fd 1 pointed at stderr from now on.
fn take_stdout() -> Result<std::fs::File, String> {
    use std::os::fd::FromRawFd;
    // SAFETY: dup/dup2 on the process's own standard descriptors; the duplicate is owned by the File
    // returned (and nothing else closes it).
    unsafe {
        let fd = libc::dup(1);
        if fd < 0 || libc::dup2(2, 1) < 0 {
            return Err(format!(
                "redirecting stdout: {}",
                std::io::Error::last_os_error()
            ));
        }
        Ok(std::fs::File::from_raw_fd(fd))
    }
}

fn reply(out: &mut std::fs::File, v: &Value) -> Result<(), String> {
    let mut line = v.to_string();
    line.push('\n');
    out.write_all(line.as_bytes())
        .and_then(|_| out.flush())
        .map_err(|e| format!("writing a reply: {e}"))
}

fn compile(
    api: &'static Api,
    topologies: &mut HashMap<String, pjrt::Topology<'static>>,
    dirs: &DumpDirs,
    request: &Value,
) -> Value {
    let (Some(topology), Some(code)) =
        (request["topology"].as_str(), request["stablehlo"].as_str())
    else {
        return json!({"ok": false, "refused": "a request needs `topology` and `stablehlo`"});
    };
    let replicas = request["num_replicas"].as_u64().unwrap_or(1) as u32;
    let partitions = request["num_partitions"].as_u64().unwrap_or(1) as u32;
    if !topologies.contains_key(topology) {
        match api.topology(topology) {
            Ok(t) => {
                topologies.insert(topology.to_string(), t);
            }
            Err(e) => return json!({"ok": false, "refused": e}),
        }
    }
    let before = dirs.snapshot();
    let start = std::time::Instant::now();
    let verdict = api.compile(
        &topologies[topology],
        code,
        &pjrt::compile_options(replicas, partitions),
    );
    let compile_ms = start.elapsed().as_secs_f64() * 1e3;
    let found = dumps::collect(dirs, &before, verdict.is_ok());
    let facts = found
        .hlo
        .as_deref()
        .map(dumps::hlo_facts)
        .unwrap_or_default();
    let schedules: serde_json::Map<String, Value> = found
        .schedules
        .iter()
        .map(|(program, s)| (program.clone(), s.to_json()))
        .collect();
    json!({
        "ok": verdict.is_ok(),
        "schedules": schedules,
        "error": verdict.err(),
        "compile_ms": compile_ms,
        "llo_counts": found.has_llo.then_some(found.llo_counts),
        "bundles_by_program": found.bundles_by_program,
        "custom_calls": facts.custom_calls,
        "used_vmem": facts.used_vmem,
        "hlo_found": found.hlo.is_some(),
    })
}
