//! Errors located at marked lines: a test file marks the line a `KernelError` must point at with a
//! trailing `// E:<tag>` comment, and checks an error's kind, message and location against it.
#![allow(dead_code)] // each suite uses some of these

use tpu_kernel::{ErrorKind, KernelError};

/// A test file's text and name, as the errors it checks are located in it.
#[derive(Clone, Copy)]
pub struct Marked {
    pub file: &'static str,
    pub src: &'static str,
}

impl Marked {
    /// The line carrying the marker comment `// E:<tag>`.
    pub fn line(&self, tag: &str) -> u32 {
        let marker = format!("// E:{tag}");
        let idx = self
            .src
            .lines()
            .position(|l| l.trim_end().ends_with(&marker))
            .unwrap_or_else(|| panic!("no marker {marker} in {}", self.file));
        idx as u32 + 1
    }

    /// `e` is a `kind` error whose message holds every needle, located at `line` of this file.
    #[track_caller]
    pub fn check_at(
        &self,
        e: &KernelError,
        kind: ErrorKind,
        tag: &str,
        line: u32,
        needles: &[&str],
    ) {
        assert_eq!(e.kind, kind, "{tag}: wrong kind: {e}");
        for n in needles {
            assert!(
                e.message.contains(n),
                "{tag}: message `{}` lacks `{n}`",
                e.message
            );
        }
        let loc = e
            .location
            .unwrap_or_else(|| panic!("{tag}: error has no location: {e}"));
        assert!(
            loc.file.ends_with(self.file),
            "{tag}: located in {}",
            loc.file
        );
        assert_eq!(loc.line, line, "{tag}: wrong line in `{e}`");
    }

    /// [`Marked::check_at`] the line marked `tag`.
    #[track_caller]
    pub fn check(&self, e: &KernelError, kind: ErrorKind, tag: &str, needles: &[&str]) {
        self.check_at(e, kind, tag, self.line(tag), needles)
    }

    /// The error of a launch that must fail, checked at the line marked `tag`.
    #[track_caller]
    pub fn expect_err<T>(
        &self,
        r: Result<T, KernelError>,
        kind: ErrorKind,
        tag: &str,
        needles: &[&str],
    ) -> KernelError {
        let e = match r {
            Ok(_) => panic!("expected a {kind:?} error for {tag}, but it succeeded"),
            Err(e) => e,
        };
        self.check(&e, kind, tag, needles);
        e
    }
}
