//! Errors are values: every user mistake found while tracing, checking or lowering becomes a [`KernelError`]
//! that names the Rust source location and, where there is one, the offending argument.

use std::fmt;
use std::panic::Location;

/// A Rust source position (`file:line:col`), captured with `#[track_caller]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SourceLoc {
    pub file: &'static str,
    pub line: u32,
    pub col: u32,
}

impl SourceLoc {
    #[track_caller]
    pub fn caller() -> Self {
        Self::from(Location::caller())
    }
}

impl From<&'static Location<'static>> for SourceLoc {
    fn from(l: &'static Location<'static>) -> Self {
        SourceLoc {
            file: l.file(),
            line: l.line(),
            col: l.column(),
        }
    }
}

impl fmt::Display for SourceLoc {
    /// `file:line:col`, the path with `a/../` steps folded (a module included with `#[path]` from
    /// another crate reports `lib/src/../../examples/add.rs`; this prints `examples/add.rs`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", normalize(self.file), self.line, self.col)
    }
}

fn normalize(path: &str) -> std::borrow::Cow<'_, str> {
    if !path.contains("..") {
        return path.into();
    }
    let mut parts: Vec<&str> = Vec::new();
    for seg in path.split('/') {
        match seg {
            ".." if parts.last().is_some_and(|p| *p != ".." && !p.is_empty()) => {
                parts.pop();
            }
            "." => {}
            s => parts.push(s),
        }
    }
    parts.join("/").into()
}

#[cfg(test)]
mod tests {
    #[test]
    fn locations_print_folded_paths() {
        assert_eq!(
            super::normalize("lib/src/../../examples/add.rs"),
            "examples/add.rs"
        );
        assert_eq!(super::normalize("../x/./y.rs"), "../x/y.rs");
        assert_eq!(super::normalize("/a/b/../c.rs"), "/a/c.rs");
        assert_eq!(super::normalize("src/lib.rs"), "src/lib.rs");
    }
}

/// What kind of mistake, so callers (and tests) can match on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// Shapes of operands do not agree (elementwise, dot, store, ...).
    Shape,
    /// Element types do not agree or are not supported by the op.
    DType,
    /// A BlockSpec breaks a Mosaic tiling rule.
    Tiling,
    /// The grid, a block shape or an index map is inconsistent with the arrays.
    Grid,
    /// Kernel parameters do not match the launch (count, kind, dtype).
    Signature,
    /// Blocks and scratch do not fit in the VMEM budget.
    Vmem,
    /// An index or slice is out of bounds.
    OutOfBounds,
    /// A traced value was used where it is not valid (outside a kernel, from another trace, ...).
    Trace,
    /// MLIR construction or verification failed (a bug in tpu-kernel, reported rather than panicking).
    Lowering,
    /// Something the DSL does not support yet.
    Unsupported,
    /// A data race the hardware would run into: a DMA's destination read, or its source or
    /// destination written, while it is in flight; a copy or a semaphore count left at kernel end.
    Race,
    /// A wait that nothing will ever end (a semaphore no one signals).
    Deadlock,
    /// Running the kernel on the CPU needs more memory than the interpreter's budget
    /// (`InterpretOptions::memory_limit`) or than the system gives.
    Memory,
    /// A bug in tpu-kernel itself (a panic inside the library, caught and located), not the user's.
    Internal,
}

/// A user-facing error with its source location.
#[derive(Clone, Debug, PartialEq)]
pub struct KernelError {
    pub kind: ErrorKind,
    pub message: String,
    pub location: Option<SourceLoc>,
    /// The launch argument the error is about, e.g. "input 1" or "scratch 0".
    pub argument: Option<String>,
}

impl KernelError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        KernelError {
            kind,
            message: message.into(),
            location: None,
            argument: None,
        }
    }
    pub fn at(mut self, loc: SourceLoc) -> Self {
        self.location.get_or_insert(loc);
        self
    }
    pub fn at_opt(mut self, loc: Option<SourceLoc>) -> Self {
        if self.location.is_none() {
            self.location = loc;
        }
        self
    }
    pub fn for_argument(mut self, arg: impl Into<String>) -> Self {
        self.argument.get_or_insert(arg.into());
        self
    }
}

impl fmt::Display for KernelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(loc) = &self.location {
            write!(f, "{loc}: ")?;
        }
        if let Some(arg) = &self.argument {
            write!(f, "{arg}: ")?;
        }
        f.write_str(&self.message)
    }
}

impl std::error::Error for KernelError {}

pub type Result<T, E = KernelError> = std::result::Result<T, E>;

/// The message of a caught panic (`&str` or `String` payloads; anything else is "unknown panic").
/// Run `f`, catching a panic with the place it happened (`file:line:col`, recorded by a panic hook this
/// crate chains in front of the existing one the first time it is needed; the old hook still runs).
pub(crate) fn catch_located<R>(
    f: impl FnOnce() -> R,
) -> std::result::Result<R, (Box<dyn std::any::Any + Send>, Option<String>)> {
    use std::cell::RefCell;
    thread_local!(static LAST: RefCell<Option<String>> = const { RefCell::new(None) });
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if let Some(l) = info.location() {
                let at = format!("{}:{}:{}", l.file(), l.line(), l.column());
                LAST.with(|c| *c.borrow_mut() = Some(at));
            }
            previous(info)
        }));
    });
    LAST.with(|c| c.borrow_mut().take());
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f))
        .map_err(|p| (p, LAST.with(|c| c.borrow_mut().take())))
}

/// Whether a panic at `at` (`file:line:col`) happened in this library's own code rather than the user's.
pub(crate) fn is_library_location(at: &str) -> bool {
    let at = at.replace('\\', "/");
    at.starts_with("kernel-runtime/src/")
        || at.contains("/kernel-runtime/src/")
        || at.contains("/kernel-runtime-")
}

pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into())
}

/// Shorthand for building an error of a kind with `format!` arguments.
macro_rules! kerr {
    ($kind:ident, $($fmt:tt)+) => {
        $crate::error::KernelError::new($crate::error::ErrorKind::$kind, format!($($fmt)+))
    };
}
pub(crate) use kerr;
