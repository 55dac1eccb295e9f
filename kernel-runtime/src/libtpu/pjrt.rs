//! The few calls of the PJRT C API (`xla/pjrt/c/pjrt_c_api.h`) a client-less compile needs, against
//! libtpu's one exported symbol `GetPjrtApi`: `PJRT_Plugin_Initialize` → `PJRT_TopologyDescription_Create`
//! → `PJRT_Compile` (no client, no TPU) → `PJRT_Executable_Destroy`, and the error accessors.
//!
//! Only this file is unsafe. The layouts are the header's (API major version 0, whose `PJRT_Api` only
//! ever grows at its end): each argument struct starts with `struct_size` (the caller's view of the
//! struct, which is how the plugin tells older callers apart) and an `extension_start` pointer; the
//! function table starts after `struct_size`, `extension_start` and the 24-byte `PJRT_Api_Version`, one
//! pointer per function in the header's order. [`Api::load`] refuses a table too short to hold
//! `PJRT_Compile`, so an index below is never read past the plugin's table.

use std::ffi::{c_char, c_int, c_void};
use std::ptr::null_mut;

/// Slots of the function table (`PJRT_Api` after its version header), in the header's order.
mod slot {
    pub const ERROR_DESTROY: usize = 0;
    pub const ERROR_MESSAGE: usize = 1;
    pub const PLUGIN_INITIALIZE: usize = 3;
    pub const EXECUTABLE_DESTROY: usize = 40;
    pub const TOPOLOGY_CREATE: usize = 82;
    pub const TOPOLOGY_DESTROY: usize = 83;
    pub const COMPILE: usize = 89;
}

#[repr(C)]
struct ApiVersion {
    struct_size: usize,
    extension_start: *mut c_void,
    major: c_int,
    minor: c_int,
}

#[repr(C)]
struct ApiHeader {
    struct_size: usize,
    extension_start: *mut c_void,
    version: ApiVersion,
    // the function table follows
}

#[repr(C)]
struct ErrorDestroyArgs {
    struct_size: usize,
    extension_start: *mut c_void,
    error: *mut c_void,
}

#[repr(C)]
struct ErrorMessageArgs {
    struct_size: usize,
    extension_start: *mut c_void,
    error: *const c_void,
    message: *const c_char,
    message_size: usize,
}

#[repr(C)]
struct PluginInitializeArgs {
    struct_size: usize,
    extension_start: *mut c_void,
}

#[repr(C)]
struct TopologyCreateArgs {
    struct_size: usize,
    extension_start: *mut c_void,
    topology_name: *const c_char,
    topology_name_size: usize,
    create_options: *const c_void,
    num_options: usize,
    topology: *mut c_void,
}

#[repr(C)]
struct TopologyDestroyArgs {
    struct_size: usize,
    extension_start: *mut c_void,
    topology: *mut c_void,
}

#[repr(C)]
struct Program {
    struct_size: usize,
    extension_start: *mut c_void,
    code: *mut c_char,
    code_size: usize,
    format: *const c_char,
    format_size: usize,
}

#[repr(C)]
struct CompileArgs {
    struct_size: usize,
    extension_start: *mut c_void,
    topology: *const c_void,
    program: *const Program,
    compile_options: *const c_char,
    compile_options_size: usize,
    client: *mut c_void,
    executable: *mut c_void,
}

#[repr(C)]
struct ExecutableDestroyArgs {
    struct_size: usize,
    extension_start: *mut c_void,
    executable: *mut c_void,
}

type Fn<A> = unsafe extern "C" fn(*mut A) -> *mut c_void;

/// libtpu's PJRT API: the library kept loaded, and its function table.
pub(super) struct Api {
    _lib: libloading::Library,
    table: *const *const c_void,
    /// `major.minor` of the plugin's PJRT API.
    pub version: (i32, i32),
}

/// A topology libtpu made from its name (`v5e:1x1`, `tpu7x:1x1x1`, ...).
pub(super) struct Topology<'a> {
    api: &'a Api,
    raw: *mut c_void,
}

impl Api {
    /// Load the shared library at `path`, fetch `GetPjrtApi` and initialize the plugin.
    pub fn load(path: &std::path::Path) -> Result<Api, String> {
        // SAFETY: loading libtpu runs its initializers; it is a PJRT plugin meant to be dlopen'ed so
        // (jax does the same). The library is kept loaded for as long as `Api` lives, which outlives
        // every pointer taken from it.
        let lib = unsafe { libloading::Library::new(path) }
            .map_err(|e| format!("cannot load {}: {e}", path.display()))?;
        // SAFETY: `GetPjrtApi` is the PJRT plugin entry point, `const PJRT_Api* GetPjrtApi(void)`.
        let get: libloading::Symbol<unsafe extern "C" fn() -> *const ApiHeader> =
            unsafe { lib.get(b"GetPjrtApi\0") }
                .map_err(|e| format!("{} has no GetPjrtApi: {e}", path.display()))?;
        // SAFETY: as above; the returned table lives as long as the library.
        let header = unsafe { get() };
        if header.is_null() {
            return Err(format!("{}: GetPjrtApi returned null", path.display()));
        }
        // SAFETY: `header` points at the plugin's `PJRT_Api`, which starts with this header.
        let (size, version) = unsafe { ((*header).struct_size, &(*header).version) };
        let table_offset = std::mem::size_of::<ApiHeader>();
        let needed = table_offset + (slot::COMPILE + 1) * std::mem::size_of::<*const c_void>();
        if size < needed || version.major != 0 {
            return Err(format!(
                "{}: PJRT API {}.{} with a {size}-byte table; tpu-kernel needs API 0.x with \
                 PJRT_Compile ({needed} bytes)",
                path.display(),
                version.major,
                version.minor
            ));
        }
        let version = (version.major, version.minor);
        // SAFETY: the table follows the header inside the `size` bytes checked above.
        let table = unsafe { (header as *const u8).add(table_offset) } as *const *const c_void;
        let api = Api {
            _lib: lib,
            table,
            version,
        };
        let mut args = PluginInitializeArgs {
            struct_size: std::mem::size_of::<PluginInitializeArgs>(),
            extension_start: null_mut(),
        };
        // SAFETY: slot PLUGIN_INITIALIZE holds `PJRT_Plugin_Initialize`, called once before anything else.
        let err = unsafe { api.call::<PluginInitializeArgs>(slot::PLUGIN_INITIALIZE, &mut args) };
        api.check(err, "PJRT_Plugin_Initialize")?;
        Ok(api)
    }

    /// Call the function in `slot` with `args`.
    ///
    /// # Safety
    /// `slot` must hold a function taking a pointer to `A` (the header's argument struct of that
    /// function), and `slot` must be within the table (`load` checked every slot of `slot::*`).
    unsafe fn call<A>(&self, slot: usize, args: &mut A) -> *mut c_void {
        // SAFETY: per the caller's contract the slot is in the table and holds an `Fn<A>`.
        unsafe {
            let f = *self.table.add(slot);
            let f: Fn<A> = std::mem::transmute::<*const c_void, Fn<A>>(f);
            f(args)
        }
    }

    /// `Ok` for a null error, else the error's message (the error destroyed).
    fn check(&self, err: *mut c_void, what: &str) -> Result<(), String> {
        if err.is_null() {
            return Ok(());
        }
        let mut m = ErrorMessageArgs {
            struct_size: std::mem::size_of::<ErrorMessageArgs>(),
            extension_start: null_mut(),
            error: err,
            message: std::ptr::null(),
            message_size: 0,
        };
        // SAFETY: slot ERROR_MESSAGE is `PJRT_Error_Message`; `err` is a live error from the plugin.
        unsafe { self.call(slot::ERROR_MESSAGE, &mut m) };
        let text = if m.message.is_null() {
            String::new()
        } else {
            // SAFETY: the plugin returned `message_size` bytes at `message`, alive until the error is
            // destroyed below.
            let bytes =
                unsafe { std::slice::from_raw_parts(m.message as *const u8, m.message_size) };
            String::from_utf8_lossy(bytes).into_owned()
        };
        let mut d = ErrorDestroyArgs {
            struct_size: std::mem::size_of::<ErrorDestroyArgs>(),
            extension_start: null_mut(),
            error: err,
        };
        // SAFETY: slot ERROR_DESTROY is `PJRT_Error_Destroy`; `err` is destroyed once, here.
        unsafe { self.call(slot::ERROR_DESTROY, &mut d) };
        Err(if what.is_empty() {
            text
        } else {
            format!("{what}: {text}")
        })
    }

    /// The topology named `name` (`PJRT_TopologyDescription_Create`).
    pub fn topology(&self, name: &str) -> Result<Topology<'_>, String> {
        let mut args = TopologyCreateArgs {
            struct_size: std::mem::size_of::<TopologyCreateArgs>(),
            extension_start: null_mut(),
            topology_name: name.as_ptr() as *const c_char,
            topology_name_size: name.len(),
            create_options: std::ptr::null(),
            num_options: 0,
            topology: null_mut(),
        };
        // SAFETY: slot TOPOLOGY_CREATE is `PJRT_TopologyDescription_Create`; the name outlives the call.
        let err = unsafe { self.call(slot::TOPOLOGY_CREATE, &mut args) };
        self.check(err, "")
            .map_err(|e| format!("libtpu refused the topology `{name}`: {e}"))?;
        Ok(Topology {
            api: self,
            raw: args.topology,
        })
    }

    /// Compile the StableHLO module `code` (MLIR text or bytecode) for `topology` with the serialized
    /// `CompileOptionsProto` `options`; `Err` is libtpu's error text.
    pub fn compile(
        &self,
        topology: &Topology<'_>,
        code: &str,
        options: &[u8],
    ) -> Result<(), String> {
        let format = "mlir";
        let program = Program {
            struct_size: std::mem::size_of::<Program>(),
            extension_start: null_mut(),
            code: code.as_ptr() as *mut c_char,
            code_size: code.len(),
            format: format.as_ptr() as *const c_char,
            format_size: format.len(),
        };
        let mut args = CompileArgs {
            struct_size: std::mem::size_of::<CompileArgs>(),
            extension_start: null_mut(),
            topology: topology.raw,
            program: &program,
            compile_options: options.as_ptr() as *const c_char,
            compile_options_size: options.len(),
            client: null_mut(),
            executable: null_mut(),
        };
        // SAFETY: slot COMPILE is `PJRT_Compile`; the program, its code and the options outlive the
        // call (the plugin only reads them during it), and `topology` is live.
        let err = unsafe { self.call(slot::COMPILE, &mut args) };
        self.check(err, "")?;
        if !args.executable.is_null() {
            let mut d = ExecutableDestroyArgs {
                struct_size: std::mem::size_of::<ExecutableDestroyArgs>(),
                extension_start: null_mut(),
                executable: args.executable,
            };
            // SAFETY: slot EXECUTABLE_DESTROY is `PJRT_Executable_Destroy`; the executable is ours,
            // destroyed once.
            let err = unsafe { self.call(slot::EXECUTABLE_DESTROY, &mut d) };
            self.check(err, "PJRT_Executable_Destroy")?;
        }
        Ok(())
    }
}

impl Drop for Topology<'_> {
    fn drop(&mut self) {
        let mut args = TopologyDestroyArgs {
            struct_size: std::mem::size_of::<TopologyDestroyArgs>(),
            extension_start: null_mut(),
            topology: self.raw,
        };
        // SAFETY: slot TOPOLOGY_DESTROY is `PJRT_TopologyDescription_Destroy`; the topology is ours,
        // destroyed once.
        let err = unsafe { self.api.call(slot::TOPOLOGY_DESTROY, &mut args) };
        let _ = self.api.check(err, "");
    }
}

/// A serialized `xla.CompileOptionsProto` with `executable_build_options { num_replicas,
/// num_partitions }` and nothing else (an empty proto asks for zero cores, which libtpu refuses).
pub(super) fn compile_options(num_replicas: u32, num_partitions: u32) -> Vec<u8> {
    fn varint(out: &mut Vec<u8>, mut v: u64) {
        while v >= 0x80 {
            out.push((v as u8 & 0x7f) | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
    }
    // ExecutableBuildOptionsProto: num_replicas = 4, num_partitions = 5 (varints).
    let mut build = Vec::new();
    build.push(4 << 3);
    varint(&mut build, num_replicas as u64);
    build.push(5 << 3);
    varint(&mut build, num_partitions as u64);
    // CompileOptionsProto: executable_build_options = 3 (a length-delimited message).
    let mut out = vec![(3 << 3) | 2];
    varint(&mut out, build.len() as u64);
    out.extend(build);
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn compile_options_are_the_known_bytes() {
        // executable_build_options {num_replicas: 1, num_partitions: 1}, as measured to work.
        assert_eq!(
            super::compile_options(1, 1),
            [0x1a, 0x04, 0x20, 0x01, 0x28, 0x01]
        );
        assert_eq!(
            super::compile_options(1, 300),
            [0x1a, 0x05, 0x20, 0x01, 0x28, 0xac, 0x02]
        );
    }
}
