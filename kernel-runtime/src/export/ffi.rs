//! The XLA FFI handler: a kernel as a CPU custom call (`jax.ffi.ffi_call`, typed FFI), running the
//! interpreter on XLA's buffers — inputs read in place, outputs written in place.
//!
//! The call frame's structs are declared here after `xla/ffi/api/c_api.h` (XLA FFI API 0.5, the
//! version jaxlib 0.12 ships); only the fields the handler touches are read, and every struct size
//! XLA checks is computed like the header's `XLA_FFI_STRUCT_SIZE`. The handler answers XLA's metadata
//! query, runs only in the execute stage, and reports every failure through XLA's error channel
//! (`XLA_FFI_Error_Create`): nothing panics or aborts across the boundary.
//!
//! Attributes: one string, `request` — the build answer's `ffi_request` (kernel, static params, batch
//! levels). Shapes and dtypes come from the buffers, so a serialized program (`jax.export`) runs in a
//! fresh process once the library is loaded there.

use super::{Built, Library, Request};
use crate::dtype::{i4, int4, DType};
use crate::error::panic_message;
use crate::error::{kerr, Result};
use crate::interpret::{interpret_into_launch, LaunchKey};
use crate::interpret::{interpret_into_prepared, ArrayView, ArrayViewMut, InterpretOptions};
use crate::launch::ArrayType;
use crate::target::Executor;
use std::ffi::{c_char, c_int, c_void, CString};
use std::mem::{offset_of, size_of};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// The XLA FFI API version this handler is written against (`XLA_FFI_API_MAJOR/MINOR`).
pub const API_MAJOR: c_int = 0;
pub const API_MINOR: c_int = 5;

const EXTENSION_METADATA: c_int = 1;
const STAGE_EXECUTE: c_int = 3;
const ATTR_STRING: c_int = 4;
const ERROR_INVALID_ARGUMENT: c_int = 3;
const ERROR_INTERNAL: c_int = 13;

#[repr(C)]
pub struct InternalExtension {
    pub struct_size: usize,
    pub kind: c_int,
    pub next: *mut InternalExtension,
}

#[repr(C)]
pub struct ApiVersion {
    pub struct_size: usize,
    pub extension_start: *mut InternalExtension,
    pub major_version: c_int,
    pub minor_version: c_int,
}

#[repr(C)]
pub struct Metadata {
    pub struct_size: usize,
    pub api_version: ApiVersion,
    pub traits: u32,
    pub state_type_id: i64,
}

#[repr(C)]
pub struct MetadataExtension {
    pub extension_base: InternalExtension,
    pub metadata: *mut Metadata,
}

#[repr(C)]
pub struct Buffer {
    pub struct_size: usize,
    pub extension_start: *mut InternalExtension,
    pub dtype: c_int,
    pub data: *mut c_void,
    pub rank: i64,
    pub dims: *mut i64,
}

#[repr(C)]
pub struct Args {
    pub struct_size: usize,
    pub extension_start: *mut InternalExtension,
    pub size: i64,
    pub types: *mut c_int,
    pub args: *mut *mut c_void,
}

#[repr(C)]
pub struct Rets {
    pub struct_size: usize,
    pub extension_start: *mut InternalExtension,
    pub size: i64,
    pub types: *mut c_int,
    pub rets: *mut *mut c_void,
}

#[repr(C)]
pub struct ByteSpan {
    pub ptr: *const c_char,
    pub len: usize,
}

#[repr(C)]
pub struct Attrs {
    pub struct_size: usize,
    pub extension_start: *mut InternalExtension,
    pub size: i64,
    pub types: *mut c_int,
    pub names: *mut *mut ByteSpan,
    pub attrs: *mut *mut c_void,
}

#[repr(C)]
pub struct CallFrame {
    pub struct_size: usize,
    pub extension_start: *mut InternalExtension,
    pub api: *const Api,
    pub ctx: *mut c_void,
    pub stage: c_int,
    pub args: Args,
    pub rets: Rets,
    pub attrs: Attrs,
    pub future: *mut c_void,
}

#[repr(C)]
pub struct ErrorCreateArgs {
    pub struct_size: usize,
    pub extension_start: *mut InternalExtension,
    pub message: *const c_char,
    pub errc: c_int,
}

type ErrorCreate = unsafe extern "C" fn(*mut ErrorCreateArgs) -> *mut c_void;

#[repr(C)]
pub struct RunIdGetArgs {
    pub struct_size: usize,
    pub extension_start: *mut InternalExtension,
    pub ctx: *mut c_void,
    pub run_id: i64,
}

#[repr(C)]
pub struct DeviceOrdinalGetArgs {
    pub struct_size: usize,
    pub extension_start: *mut InternalExtension,
    pub ctx: *mut c_void,
    pub device_ordinal: i32,
}

type RunIdGet = unsafe extern "C" fn(*mut RunIdGetArgs) -> *mut c_void;
type DeviceOrdinalGet = unsafe extern "C" fn(*mut DeviceOrdinalGetArgs) -> *mut c_void;

/// `XLA_FFI_Api` up to `XLA_FFI_DeviceOrdinal_Get`: the handler calls `XLA_FFI_Error_Create`, and
/// for a kernel that talks across devices `XLA_FFI_RunId_Get` (which launch) and
/// `XLA_FFI_DeviceOrdinal_Get` (which device); the functions between are not called.
#[repr(C)]
pub struct Api {
    pub struct_size: usize,
    pub extension_start: *mut InternalExtension,
    pub api_version: ApiVersion,
    pub internal_api: *const c_void,
    pub error_create: Option<ErrorCreate>,
    /// `XLA_FFI_Error_GetDetails` … `XLA_FFI_Future_SetError`, in the header's order.
    pub unused: [*const c_void; 15],
    pub run_id_get: Option<RunIdGet>,
    pub device_ordinal_get: Option<DeviceOrdinalGet>,
}

/// `XLA_FFI_STRUCT_SIZE(T, last_field)`: the end of the last field.
macro_rules! struct_size {
    ($t:ty, $field:ident, $ft:ty) => {
        offset_of!($t, $field) + size_of::<$ft>()
    };
}

/// Struct sizes and field offsets as this handler lays them out, for a test that compares them with
/// the C header compiled by a C compiler.
pub fn layout() -> Vec<(&'static str, usize)> {
    vec![
        (
            "XLA_FFI_Buffer_STRUCT_SIZE",
            struct_size!(Buffer, dims, *mut i64),
        ),
        (
            "XLA_FFI_CallFrame_STRUCT_SIZE",
            struct_size!(CallFrame, attrs, Attrs),
        ),
        (
            "XLA_FFI_Metadata_STRUCT_SIZE",
            struct_size!(Metadata, traits, u32),
        ),
        (
            "XLA_FFI_Api_Version_STRUCT_SIZE",
            struct_size!(ApiVersion, minor_version, c_int),
        ),
        (
            "XLA_FFI_Error_Create_Args_STRUCT_SIZE",
            struct_size!(ErrorCreateArgs, errc, c_int),
        ),
        (
            "offsetof(XLA_FFI_CallFrame, api)",
            offset_of!(CallFrame, api),
        ),
        (
            "offsetof(XLA_FFI_CallFrame, stage)",
            offset_of!(CallFrame, stage),
        ),
        (
            "offsetof(XLA_FFI_CallFrame, args)",
            offset_of!(CallFrame, args),
        ),
        (
            "offsetof(XLA_FFI_CallFrame, rets)",
            offset_of!(CallFrame, rets),
        ),
        (
            "offsetof(XLA_FFI_CallFrame, attrs)",
            offset_of!(CallFrame, attrs),
        ),
        ("offsetof(XLA_FFI_Buffer, dims)", offset_of!(Buffer, dims)),
        ("offsetof(XLA_FFI_Attrs, attrs)", offset_of!(Attrs, attrs)),
        (
            "offsetof(XLA_FFI_Api, XLA_FFI_Error_Create)",
            offset_of!(Api, error_create),
        ),
        (
            "offsetof(XLA_FFI_Metadata, traits)",
            offset_of!(Metadata, traits),
        ),
        (
            "offsetof(XLA_FFI_Api, XLA_FFI_RunId_Get)",
            offset_of!(Api, run_id_get),
        ),
        (
            "offsetof(XLA_FFI_Api, XLA_FFI_DeviceOrdinal_Get)",
            offset_of!(Api, device_ordinal_get),
        ),
        (
            "XLA_FFI_RunId_Get_Args_STRUCT_SIZE",
            struct_size!(RunIdGetArgs, run_id, i64),
        ),
        (
            "XLA_FFI_DeviceOrdinal_Get_Args_STRUCT_SIZE",
            struct_size!(DeviceOrdinalGetArgs, device_ordinal, i32),
        ),
        (
            "offsetof(XLA_FFI_Metadata_Extension, metadata)",
            offset_of!(MetadataExtension, metadata),
        ),
    ]
}

/// The handler (`tpu_kernel_ffi` in a library): returns null on success, else an XLA error.
///
/// # Safety
/// `frame` must be null or a call frame XLA passes to a typed FFI handler, valid for the call.
pub unsafe fn handle(lib: &Library, frame: *mut CallFrame) -> *mut c_void {
    if frame.is_null() {
        return std::ptr::null_mut();
    }
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: `frame` is a valid call frame (the caller's contract).
        unsafe { handle_frame(lib, &mut *frame) }
    }));
    let err = match outcome {
        Ok(Ok(())) => return std::ptr::null_mut(),
        Ok(Err(e)) => (ERROR_INVALID_ARGUMENT, e.to_string()),
        Err(p) => (
            ERROR_INTERNAL,
            format!(
                "internal error in tpu-kernel's FFI handler (please report): {}",
                panic_message(&*p)
            ),
        ),
    };
    // SAFETY: `frame` is valid; `api` is XLA's API table for this call.
    unsafe { create_error(&*frame, err.0, &err.1) }
}

/// An `XLA_FFI_Error` carrying `message` (XLA copies the text).
unsafe fn create_error(frame: &CallFrame, errc: c_int, message: &str) -> *mut c_void {
    let text =
        CString::new(format!("tpu-kernel: {message}").replace('\0', " ")).unwrap_or_default();
    // SAFETY: `api` points to XLA's API table while the handler runs.
    let create = unsafe { frame.api.as_ref() }.and_then(|api| api.error_create);
    let Some(create) = create else {
        // Without XLA's API table there is no error channel; report success-less nothing rather
        // than unwinding into C.
        return std::ptr::null_mut();
    };
    let mut args = ErrorCreateArgs {
        struct_size: struct_size!(ErrorCreateArgs, errc, c_int),
        extension_start: std::ptr::null_mut(),
        message: text.as_ptr(),
        errc,
    };
    // SAFETY: `create` is XLA's `XLA_FFI_Error_Create`, called with a valid argument struct.
    unsafe { create(&mut args) }
}

/// Everything but error reporting.
unsafe fn handle_frame(lib: &Library, frame: &mut CallFrame) -> Result<()> {
    // SAFETY: (whole function) XLA keeps the frame's arrays (args, rets, attrs and the buffers and
    // dims they point to) valid and of the stated lengths for the duration of the call.
    unsafe {
        let ext = frame.extension_start;
        if !ext.is_null() && (*ext).kind == EXTENSION_METADATA {
            let meta = (*(ext as *mut MetadataExtension)).metadata;
            if !meta.is_null() {
                (*meta).api_version = ApiVersion {
                    struct_size: struct_size!(ApiVersion, minor_version, c_int),
                    extension_start: std::ptr::null_mut(),
                    major_version: API_MAJOR,
                    minor_version: API_MINOR,
                };
                (*meta).traits = 0;
            }
            return Ok(());
        }
        if frame.stage != STAGE_EXECUTE {
            return Ok(());
        }
        let request = string_attr(&frame.attrs, "request")?;
        let args = buffers(frame.args.args, frame.args.size)?;
        let rets = buffers(frame.rets.rets, frame.rets.size)?;
        let inputs: Vec<(ArrayType, *mut c_void)> = args
            .iter()
            .map(|b| Ok((buffer_type(b)?, b.data)))
            .collect::<Result<_>>()?;
        let built = cached_build(lib, request, &inputs)?;
        let outputs: Vec<(ArrayType, *mut c_void)> = rets
            .iter()
            .map(|b| Ok((buffer_type(b)?, b.data)))
            .collect::<Result<_>>()?;
        if outputs.len() != built.outputs.len() {
            return Err(kerr!(
                Signature,
                "kernel `{}` has {} outputs, XLA passed {} result buffers",
                built.call.kernel.name,
                built.outputs.len(),
                outputs.len()
            ));
        }
        for (i, ((t, _), want)) in outputs.iter().zip(&built.outputs).enumerate() {
            if t != want {
                return Err(kerr!(
                    Shape,
                    "kernel `{}` output {i} is {:?} {}, XLA passed a {:?} {} buffer",
                    built.call.kernel.name,
                    want.shape,
                    want.dtype,
                    t.shape,
                    t.dtype
                ));
            }
        }
        // int4: XLA's S4 buffers are packed two per byte; the engines take one byte per element
        // (`dtype/int4.rs`). Unpacked copies of the inputs, and outputs written unpacked, then packed.
        let unpacked_in: Vec<Option<Vec<i4>>> = inputs
            .iter()
            .map(|(t, p)| {
                (t.dtype == DType::I4).then(|| {
                    let n = t.shape.iter().product::<usize>();
                    let packed = std::slice::from_raw_parts(*p as *const u8, int4::packed_len(n));
                    int4::unpack(packed, n)
                })
            })
            .collect();
        let mut unpacked_out: Vec<Option<Vec<i4>>> = outputs
            .iter()
            .map(|(t, _)| {
                (t.dtype == DType::I4).then(|| vec![i4::default(); t.shape.iter().product()])
            })
            .collect();
        let views: Vec<ArrayView<'_>> = inputs
            .iter()
            .zip(&unpacked_in)
            .map(|((t, p), u)| {
                let ptr = u
                    .as_ref()
                    .map_or(*p as *const u8, |v| v.as_ptr() as *const u8);
                ArrayView::from_raw(&t.shape, t.dtype, ptr)
            })
            .collect();
        let mut outs: Vec<ArrayViewMut<'_>> = outputs
            .iter()
            .zip(&mut unpacked_out)
            .map(|((t, p), u)| {
                let ptr = u
                    .as_mut()
                    .map_or(*p as *mut u8, |v| v.as_mut_ptr() as *mut u8);
                ArrayViewMut::from_raw(&t.shape, t.dtype, ptr)
            })
            .collect();
        if built.call.kernel.communicates() {
            let key = LaunchKey {
                run_id: run_id(frame)?,
                request,
                device: mesh_position(request, device_ordinal(frame)?)?,
            };
            interpret_into_launch(
                &built.call.kernel,
                &views,
                &mut outs,
                &InterpretOptions::default(),
                key,
            )?;
        } else {
            let options = InterpretOptions::default();
            interpret_into_prepared(
                &built.call.kernel,
                built.prepared(&options, &lib.stats),
                &views,
                &mut outs,
                &options,
            )?;
        }
        drop(outs);
        for ((t, p), u) in outputs.iter().zip(&unpacked_out) {
            if let Some(v) = u {
                let n = t.shape.iter().product::<usize>();
                let packed = std::slice::from_raw_parts_mut(*p as *mut u8, int4::packed_len(n));
                int4::pack(v, packed);
            }
        }
        Ok(())
    }
}

/// XLA's function `f` of the frame's API, when the API is recent enough to have it.
///
/// # Safety
/// `frame.api` points to XLA's `XLA_FFI_Api`, whose `struct_size` says how much of it exists.
unsafe fn api_fn<T: Copy>(
    frame: &CallFrame,
    offset: usize,
    f: impl Fn(&Api) -> Option<T>,
    name: &str,
) -> Result<T> {
    // SAFETY: as the function's contract; only fields within `struct_size` are read.
    let api = unsafe { &*frame.api };
    if api.struct_size < offset + size_of::<usize>() {
        return Err(kerr!(
            Unsupported,
            "this XLA's FFI API has no {name}, which a kernel that talks across devices needs (jax 0.5 or later)"
        ));
    }
    f(api).ok_or_else(|| kerr!(Unsupported, "this XLA's FFI API leaves {name} unset"))
}

/// XLA's id of the program run this call is part of (every device's call of one run has it).
unsafe fn run_id(frame: &CallFrame) -> Result<i64> {
    // SAFETY: the frame is XLA's for this call; the args struct is laid out as the header's.
    unsafe {
        let get = api_fn(
            frame,
            offset_of!(Api, run_id_get),
            |a| a.run_id_get,
            "XLA_FFI_RunId_Get",
        )?;
        let mut args = RunIdGetArgs {
            struct_size: struct_size!(RunIdGetArgs, run_id, i64),
            extension_start: std::ptr::null_mut(),
            ctx: frame.ctx,
            run_id: 0,
        };
        if !get(&mut args).is_null() {
            return Err(kerr!(Internal, "XLA_FFI_RunId_Get failed"));
        }
        Ok(args.run_id)
    }
}

/// The ordinal of the device XLA runs this call on.
unsafe fn device_ordinal(frame: &CallFrame) -> Result<i64> {
    // SAFETY: as for `run_id`.
    unsafe {
        let get = api_fn(
            frame,
            offset_of!(Api, device_ordinal_get),
            |a| a.device_ordinal_get,
            "XLA_FFI_DeviceOrdinal_Get",
        )?;
        let mut args = DeviceOrdinalGetArgs {
            struct_size: struct_size!(DeviceOrdinalGetArgs, device_ordinal, i32),
            extension_start: std::ptr::null_mut(),
            ctx: frame.ctx,
            device_ordinal: -1,
        };
        if !get(&mut args).is_null() {
            return Err(kerr!(Internal, "XLA_FFI_DeviceOrdinal_Get failed"));
        }
        Ok(args.device_ordinal as i64)
    }
}

/// Device `ordinal`'s position in the mesh of the request (`"mesh_devices"`: the mesh's device ids
/// in mesh order, which the JAX op's CPU lowering adds).
fn mesh_position(request: &str, ordinal: i64) -> Result<usize> {
    let v: serde_json::Value = serde_json::from_str(request)
        .map_err(|e| kerr!(Signature, "the FFI `request` attribute is not JSON ({e})"))?;
    let ids: Vec<i64> = v
        .get("mesh_devices")
        .and_then(serde_json::Value::as_array)
        .map(|a| a.iter().filter_map(serde_json::Value::as_i64).collect())
        .ok_or_else(|| {
            kerr!(
                Signature,
                "a kernel that talks across devices runs inside `jax.shard_map` (its request names no mesh devices)"
            )
        })?;
    ids.iter().position(|&d| d == ordinal).ok_or_else(|| {
        kerr!(
            Signature,
            "XLA runs this call on device {ordinal}, which is not in the kernel's mesh (devices {ids:?})"
        )
    })
}

/// The kernel for (request, input types): from the handler's cache, else built (and counted).
fn cached_build(
    lib: &Library,
    request: &str,
    inputs: &[(ArrayType, *mut c_void)],
) -> Result<Arc<Built>> {
    let mut key = String::with_capacity(request.len() + 16 * inputs.len());
    key.push_str(request);
    for (t, _) in inputs {
        key.push_str(&format!("|{:?}{}", t.shape, t.dtype.name()));
    }
    if let Some(b) = lib.ffi_cache().get(&key) {
        return Ok(Arc::clone(b));
    }
    let v: serde_json::Value = serde_json::from_str(request)
        .map_err(|e| kerr!(Signature, "the FFI `request` attribute is not JSON ({e})"))?;
    let mut req = Request::from_json(&v)?;
    req.inputs = inputs.iter().map(|(t, _)| t.clone()).collect();
    // The handler runs the kernel on the CPU: its launch is built for the CPU (same outputs; a
    // launch function may pick, say, smaller blocks — checked against XLA's buffers below).
    req.executor = Executor::Cpu;
    let built = lib.build(&req)?;
    lib.stats.ffi_builds.fetch_add(1, Ordering::Relaxed);
    lib.ffi_cache().insert(key, Arc::clone(&built));
    Ok(built)
}

unsafe fn string_attr<'a>(attrs: &'a Attrs, name: &str) -> Result<&'a str> {
    for i in 0..attrs.size.max(0) as usize {
        // SAFETY: `names`, `types` and `attrs` hold `size` entries (the caller's contract).
        let (n, ty, a) = unsafe {
            (
                *attrs.names.add(i),
                *attrs.types.add(i),
                *attrs.attrs.add(i),
            )
        };
        // SAFETY: each name is a valid byte span.
        let n = unsafe { span(n) };
        if n != Some(name) {
            continue;
        }
        if ty != ATTR_STRING {
            return Err(kerr!(
                Signature,
                "the FFI attribute `{name}` must be a string"
            ));
        }
        // SAFETY: a string attribute points to a byte span.
        return unsafe { span(a as *const ByteSpan) }
            .ok_or_else(|| kerr!(Signature, "the FFI attribute `{name}` is not UTF-8"));
    }
    Err(kerr!(
        Signature,
        "the FFI call has no `{name}` attribute (call kernels through the tpu_kernel package)"
    ))
}

unsafe fn span<'a>(s: *const ByteSpan) -> Option<&'a str> {
    // SAFETY: `s` is null or a valid span of `len` bytes.
    let s = unsafe { s.as_ref()? };
    if s.ptr.is_null() {
        return Some("");
    }
    // SAFETY: as above.
    let bytes = unsafe { std::slice::from_raw_parts(s.ptr as *const u8, s.len) };
    std::str::from_utf8(bytes).ok()
}

unsafe fn buffers<'a>(list: *mut *mut c_void, n: i64) -> Result<Vec<&'a Buffer>> {
    (0..n.max(0) as usize)
        .map(|i| {
            // SAFETY: `list` holds `n` buffer pointers (the caller's contract).
            unsafe { (*list.add(i) as *const Buffer).as_ref() }
                .ok_or_else(|| kerr!(Signature, "XLA passed a null buffer"))
        })
        .collect()
}

unsafe fn buffer_type(b: &Buffer) -> Result<ArrayType> {
    let dtype = match DType::from_xla_ffi_code(b.dtype as u32) {
        Some(d) => d,
        None => {
            let other = b.dtype;
            return Err(kerr!(
                DType,
                "XLA buffer of element type {other} (XLA_FFI_DataType); kernels take f32, bf16, i32, i8, u8, u32 or bool"
            ));
        }
    };
    let rank = b.rank.max(0) as usize;
    let dims = if rank == 0 {
        Vec::new()
    } else {
        // SAFETY: `dims` holds `rank` entries.
        unsafe { std::slice::from_raw_parts(b.dims, rank) }
            .iter()
            .map(|&d| usize::try_from(d).map_err(|_| kerr!(Shape, "negative dimension {d}")))
            .collect::<Result<Vec<_>>>()?
    };
    Ok(ArrayType::new(dims, dtype))
}
