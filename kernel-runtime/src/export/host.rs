//! Host functions: plain Rust functions a kernel library exports beside its kernels, for what a caller
//! computes on the host around a launch (megablox's group metadata from the group sizes). They run on
//! the caller's values, never on a device; `export_library!(.., host = [f])` lists them and the C ABI
//! calls them (`tpu_kernel_call("host", {"function": "f", "args": [..]})`), so another language wraps
//! the Rust function instead of re-implementing it.
//!
//! A host function takes and returns [`StaticParam`] values (ints, floats, bools, strings, tuples,
//! arrays and `Vec`s of them) and returns `Result<_, KernelError>`: its arguments are read from JSON
//! by their Rust types, a mistyped one is an error naming its position, and its own errors pass
//! through as they are.

use super::StaticParam;
use crate::error::{kerr, panic_message, Result};
use serde_json::Value;
use std::panic::{catch_unwind, AssertUnwindSafe};

type JsonFn = Box<dyn Fn(&[Value]) -> Result<Value> + Send + Sync>;

/// One exported host function: its name (the Rust function's), its arguments' types, and the function
/// behind a JSON shim.
pub struct HostExport {
    pub name: &'static str,
    /// The arguments' Rust types, in order (messages and the library description).
    pub args: Vec<String>,
    call: JsonFn,
}

impl std::fmt::Debug for HostExport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HostExport({}({}))", self.name, self.args.join(", "))
    }
}

impl HostExport {
    /// `f` exported as `name` (what `export_library!` generates for each `host` entry).
    pub fn new<Args, F: HostFn<Args>>(name: &'static str, f: F) -> HostExport {
        HostExport {
            name,
            args: F::arg_types(),
            call: Box::new(move |args| f.call_json(name, args)),
        }
    }

    /// Run the function on JSON arguments: its result as JSON, or a `KernelError` — a wrong number or
    /// type of arguments (naming the argument), the function's own error, or a panic caught here.
    pub fn call(&self, args: &[Value]) -> Result<Value> {
        if args.len() != self.args.len() {
            return Err(kerr!(
                Signature,
                "host function `{}` takes {} argument(s) ({}), got {}",
                self.name,
                self.args.len(),
                self.args.join(", "),
                args.len()
            ));
        }
        catch_unwind(AssertUnwindSafe(|| (self.call)(args))).unwrap_or_else(|p| {
            Err(kerr!(
                Unsupported,
                "host function `{}` panicked: {}",
                self.name,
                panic_message(&*p)
            ))
        })
    }
}

/// A Rust function callable as a host function: `Fn(A, B, ..) -> Result<R, KernelError>` with
/// [`StaticParam`] arguments and result, for one to six arguments. `Args` is the tuple of argument
/// types (it only tells the impls apart).
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be exported as a host function",
    label = "not `fn(A, ..) -> Result<R, KernelError>` with 1 to 6 arguments",
    note = "a host function's arguments and result are static-parameter types: ints, floats, bools, strings, and tuples, arrays or Vecs of them"
)]
pub trait HostFn<Args>: Send + Sync + 'static {
    fn arg_types() -> Vec<String>;
    /// Read the arguments (already counted), call, write the result.
    fn call_json(&self, name: &str, args: &[Value]) -> Result<Value>;
}

/// Argument `i` of host function `name` as a `T`.
fn arg<T: StaticParam>(name: &str, args: &[Value], i: usize) -> Result<T> {
    let v = args.get(i).unwrap_or(&Value::Null);
    T::from_json(v).map_err(|e| {
        kerr!(
            Signature,
            "argument {i} of host function `{name}` must be {}: {e}",
            T::type_name()
        )
        .for_argument(format!("argument {i}"))
    })
}

macro_rules! host_fn {
    ($($a:ident $i:tt),+) => {
        impl<Func, R, $($a),+> HostFn<($($a,)+)> for Func
        where
            Func: Fn($($a),+) -> Result<R> + Send + Sync + 'static,
            R: StaticParam,
            $($a: StaticParam),+
        {
            fn arg_types() -> Vec<String> {
                vec![$($a::type_name()),+]
            }
            fn call_json(&self, name: &str, args: &[Value]) -> Result<Value> {
                Ok(self($(arg::<$a>(name, args, $i)?),+)?.to_json())
            }
        }
    };
}
host_fn!(A 0);
host_fn!(A 0, B 1);
host_fn!(A 0, B 1, C 2);
host_fn!(A 0, B 1, C 2, D 3);
host_fn!(A 0, B 1, C 2, D 3, E 4);
host_fn!(A 0, B 1, C 2, D 3, E 4, F 5);
