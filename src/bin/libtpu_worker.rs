//! `tpu-kernel-libtpu-worker`: a libtpu worker process for `kernel_runtime::libtpu::Compiler` (which
//! starts it; it is not run by hand). One per concurrent compile; libtpu loaded once per process.

fn main() -> std::process::ExitCode {
    match kernel_runtime::libtpu::serve() {
        Ok(never) => match never {},
        Err(e) => {
            eprintln!("error: {e}");
            std::process::ExitCode::from(2)
        }
    }
}
