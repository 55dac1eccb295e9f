//! XLA's side of the FFI handler, in Rust: a typed-FFI call frame as XLA:CPU builds one (buffers,
//! the `request` string attribute, the API table with `XLA_FFI_Error_Create`), so tests call the
//! handler entry directly — from many threads, and under valgrind, where a Python process with jax
//! would be impractical.
#![allow(dead_code)]

use std::ffi::{c_char, c_int, c_void, CStr};
use std::mem::size_of;
use tpu_kernel::__private::export::ffi::{
    self, Api, ApiVersion, Args, Attrs, Buffer, ByteSpan, CallFrame, ErrorCreateArgs,
    InternalExtension, Metadata, MetadataExtension, Rets,
};
use tpu_kernel::__private::export::Library;
use tpu_kernel::prelude::*;
use tpu_kernel::runtime::interpret::{HostArray, HostData};

const STAGE_EXECUTE: c_int = 3;
const ARG_BUFFER: c_int = 1;
const ATTR_STRING: c_int = 4;

/// `XLA_FFI_DataType` of a dtype.
pub fn xla_dtype(d: DType) -> c_int {
    match d {
        DType::Bool => 1,
        DType::I8 => 2,
        DType::I32 => 4,
        DType::U8 => 6,
        DType::U32 => 8,
        DType::F32 => 11,
        DType::BF16 => 16,
        DType::F16 => 10,
        DType::F8E5M2 => 19,
        DType::F8E4M3FN => 20,
        DType::I4 => 21,
    }
}

/// What `XLA_FFI_Error_Create` received: the handler's message and error code.
#[derive(Debug)]
pub struct XlaError {
    pub code: c_int,
    pub message: String,
}

/// The test's `XLA_FFI_Error_Create`: the message copied into a boxed `XlaError` (as XLA copies it).
unsafe extern "C" fn error_create(args: *mut ErrorCreateArgs) -> *mut c_void {
    // SAFETY: the handler passes a valid argument struct with a NUL-terminated message.
    let (code, message) = unsafe {
        let a = &*args;
        (
            a.errc,
            CStr::from_ptr(a.message).to_string_lossy().into_owned(),
        )
    };
    Box::into_raw(Box::new(XlaError { code, message })).cast()
}

thread_local! {
    /// The device this thread plays in the test's XLA (`set_device`).
    static ORDINAL: std::cell::Cell<i32> = const { std::cell::Cell::new(0) };
}

/// Make this thread's calls run on device `ordinal` (what `XLA_FFI_DeviceOrdinal_Get` answers).
pub fn set_device(ordinal: i32) {
    ORDINAL.with(|o| o.set(ordinal));
}

/// The test's `XLA_FFI_RunId_Get`: one run.
unsafe extern "C" fn run_id_get(args: *mut ffi::RunIdGetArgs) -> *mut c_void {
    // SAFETY: the handler passes a valid argument struct.
    unsafe { (*args).run_id = 7 };
    std::ptr::null_mut()
}

/// The test's `XLA_FFI_DeviceOrdinal_Get`: the thread's device.
unsafe extern "C" fn device_ordinal_get(args: *mut ffi::DeviceOrdinalGetArgs) -> *mut c_void {
    // SAFETY: the handler passes a valid argument struct.
    unsafe { (*args).device_ordinal = ORDINAL.with(|o| o.get()) };
    std::ptr::null_mut()
}

fn api() -> Api {
    Api {
        struct_size: size_of::<Api>(),
        extension_start: std::ptr::null_mut(),
        api_version: ApiVersion {
            struct_size: size_of::<ApiVersion>(),
            extension_start: std::ptr::null_mut(),
            major_version: ffi::API_MAJOR,
            minor_version: ffi::API_MINOR,
        },
        internal_api: std::ptr::null(),
        error_create: Some(error_create),
        unused: [std::ptr::null(); 15],
        run_id_get: Some(run_id_get),
        device_ordinal_get: Some(device_ordinal_get),
    }
}

/// One array as XLA hands it over: its bytes in a buffer of exactly that size (so memcheck sees any
/// access past it), `offset` bytes into the allocation when a test wants it misaligned.
pub struct XlaBuffer {
    pub shape: Vec<usize>,
    pub dtype: DType,
    storage: Vec<u8>,
    offset: usize,
}

impl XlaBuffer {
    pub fn of(a: &HostArray) -> XlaBuffer {
        XlaBuffer::with_offset(a, 0)
    }

    /// `a`'s bytes starting `offset` bytes past an element-aligned address.
    pub fn with_offset(a: &HostArray, offset: usize) -> XlaBuffer {
        let bytes = bytes_of(a.data());
        let mut storage = vec![0u8; bytes.len() + offset];
        storage[offset..].copy_from_slice(&bytes);
        // (A `Vec<u8>` of non-zero size comes from the allocator at least 8-byte aligned.)
        XlaBuffer {
            shape: a.shape().to_vec(),
            dtype: a.dtype(),
            storage,
            offset,
        }
    }

    /// Room for an output of this shape and dtype (zeros, exactly its size).
    pub fn zeros(shape: &[usize], dtype: DType) -> XlaBuffer {
        let n: usize = shape.iter().product();
        XlaBuffer {
            shape: shape.to_vec(),
            dtype,
            storage: vec![0u8; xla_bytes(n, dtype)],
            offset: 0,
        }
    }

    pub fn ptr(&self) -> *mut u8 {
        self.storage.as_ptr().wrapping_add(self.offset).cast_mut()
    }

    /// The contents, as bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.storage[self.offset..]
    }

    /// The contents as a host array (for comparing with the interpreter's owned results).
    pub fn to_host(&self) -> HostArray {
        let b = &self.storage[self.offset..];
        let data = match self.dtype {
            DType::F32 => HostData::F32(
                b.chunks_exact(4)
                    .map(|c| f32::from_ne_bytes(c.try_into().unwrap()))
                    .collect(),
            ),
            DType::BF16 => HostData::BF16(
                b.chunks_exact(2)
                    .map(|c| half::bf16::from_bits(u16::from_ne_bytes(c.try_into().unwrap())))
                    .collect(),
            ),
            DType::I32 => HostData::I32(
                b.chunks_exact(4)
                    .map(|c| i32::from_ne_bytes(c.try_into().unwrap()))
                    .collect(),
            ),
            DType::U32 => HostData::U32(
                b.chunks_exact(4)
                    .map(|c| u32::from_ne_bytes(c.try_into().unwrap()))
                    .collect(),
            ),
            DType::I8 => HostData::I8(b.iter().map(|&v| v as i8).collect()),
            DType::U8 => HostData::U8(b.to_vec()),
            DType::Bool => HostData::Bool(b.iter().map(|&v| v != 0).collect()),
            DType::F16 => HostData::F16(
                b.chunks_exact(2)
                    .map(|c| half::f16::from_bits(u16::from_ne_bytes(c.try_into().unwrap())))
                    .collect(),
            ),
            DType::F8E4M3FN => {
                HostData::F8E4M3FN(b.iter().map(|&v| f8e4m3fn::from_bits(v)).collect())
            }
            DType::F8E5M2 => HostData::F8E5M2(b.iter().map(|&v| f8e5m2::from_bits(v)).collect()),
            DType::I4 => HostData::I4(
                (0..self.shape.iter().product::<usize>())
                    .map(|i| i4::from_bits(b[i / 2] >> (4 * (i % 2))))
                    .collect(),
            ),
        };
        HostArray::new(&self.shape, data).expect("shape and data agree")
    }
}

/// Bytes XLA gives `n` elements of `dtype`: S4 packed two per byte (measured with jax 0.12).
pub fn xla_bytes(n: usize, dtype: DType) -> usize {
    if dtype == DType::I4 {
        n.div_ceil(2)
    } else {
        n * dtype.size_bytes()
    }
}

/// The bytes of host data, native-endian (bools as 0/1 bytes, as XLA's PRED; int4 packed two per
/// byte, element 2i in the low nibble, as XLA's S4).
pub fn bytes_of(d: &HostData) -> Vec<u8> {
    match d {
        HostData::F32(v) => v.iter().flat_map(|x| x.to_ne_bytes()).collect(),
        HostData::BF16(v) => v.iter().flat_map(|x| x.to_bits().to_ne_bytes()).collect(),
        HostData::I32(v) => v.iter().flat_map(|x| x.to_ne_bytes()).collect(),
        HostData::U32(v) => v.iter().flat_map(|x| x.to_ne_bytes()).collect(),
        HostData::I8(v) => v.iter().map(|&x| x as u8).collect(),
        HostData::U8(v) => v.clone(),
        HostData::Bool(v) => v.iter().map(|&x| x as u8).collect(),
        HostData::F16(v) => v.iter().flat_map(|x| x.to_bits().to_ne_bytes()).collect(),
        HostData::F8E4M3FN(v) => v.iter().map(|x| x.to_bits()).collect(),
        HostData::F8E5M2(v) => v.iter().map(|x| x.to_bits()).collect(),
        HostData::I4(v) => v
            .chunks(2)
            .map(|p| p[0].to_bits() | p.get(1).map_or(0, |h| h.to_bits() << 4))
            .collect(),
    }
}

/// Describes `bufs` as XLA does: one `XLA_FFI_Buffer` per array, dims as i64.
struct Described {
    dims: Vec<Vec<i64>>,
    buffers: Vec<Buffer>,
    pointers: Vec<*mut c_void>,
    types: Vec<c_int>,
}

fn describe(bufs: &[&XlaBuffer]) -> Described {
    let mut dims: Vec<Vec<i64>> = bufs
        .iter()
        .map(|b| b.shape.iter().map(|&d| d as i64).collect())
        .collect();
    let mut buffers: Vec<Buffer> = bufs
        .iter()
        .zip(dims.iter_mut())
        .map(|(b, d)| Buffer {
            struct_size: size_of::<Buffer>(),
            extension_start: std::ptr::null_mut(),
            dtype: xla_dtype(b.dtype),
            data: b.ptr().cast(),
            rank: d.len() as i64,
            dims: d.as_mut_ptr(),
        })
        .collect();
    let pointers = buffers
        .iter_mut()
        .map(|b| (b as *mut Buffer).cast())
        .collect();
    Described {
        dims,
        buffers,
        pointers,
        types: vec![ARG_BUFFER; bufs.len()],
    }
}

/// One execute-stage call of the handler of `lib` with these buffers and `request` attribute, as XLA
/// makes it: `Ok` when the handler returned null, else the error it created.
pub fn call(
    lib: &Library,
    request: &str,
    inputs: &[&XlaBuffer],
    outputs: &[&XlaBuffer],
) -> Result<(), XlaError> {
    let api = api();
    let mut ins = describe(inputs);
    let mut outs = describe(outputs);
    let mut name = ByteSpan {
        ptr: b"request".as_ptr().cast::<c_char>(),
        len: "request".len(),
    };
    let mut value = ByteSpan {
        ptr: request.as_ptr().cast::<c_char>(),
        len: request.len(),
    };
    let mut names: Vec<*mut ByteSpan> = vec![&mut name];
    let mut attr_types: Vec<c_int> = vec![ATTR_STRING];
    let mut attrs: Vec<*mut c_void> = vec![(&mut value as *mut ByteSpan).cast()];
    let mut frame = CallFrame {
        struct_size: size_of::<CallFrame>(),
        extension_start: std::ptr::null_mut(),
        api: &api,
        ctx: std::ptr::null_mut(),
        stage: STAGE_EXECUTE,
        args: Args {
            struct_size: size_of::<Args>(),
            extension_start: std::ptr::null_mut(),
            size: inputs.len() as i64,
            types: ins.types.as_mut_ptr(),
            args: ins.pointers.as_mut_ptr(),
        },
        rets: Rets {
            struct_size: size_of::<Rets>(),
            extension_start: std::ptr::null_mut(),
            size: outputs.len() as i64,
            types: outs.types.as_mut_ptr(),
            rets: outs.pointers.as_mut_ptr(),
        },
        attrs: Attrs {
            struct_size: size_of::<Attrs>(),
            extension_start: std::ptr::null_mut(),
            size: 1,
            types: attr_types.as_mut_ptr(),
            names: names.as_mut_ptr(),
            attrs: attrs.as_mut_ptr(),
        },
        future: std::ptr::null_mut(),
    };
    // SAFETY: the frame and everything it points to live until the handler returns; the buffers
    // hold their arrays' bytes.
    let err = unsafe { ffi::handle(lib, &mut frame) };
    let _ = (&ins.dims, &ins.buffers, &outs.dims, &outs.buffers);
    if err.is_null() {
        Ok(())
    } else {
        // SAFETY: a non-null answer is a box made by `error_create` above.
        Err(*unsafe { Box::from_raw(err.cast::<XlaError>()) })
    }
}

/// XLA's metadata query (before the first execute): the handler's answer, the API version.
pub fn metadata(lib: &Library) -> (c_int, c_int) {
    let api = api();
    let mut meta = Metadata {
        struct_size: size_of::<Metadata>(),
        api_version: ApiVersion {
            struct_size: size_of::<ApiVersion>(),
            extension_start: std::ptr::null_mut(),
            major_version: -1,
            minor_version: -1,
        },
        traits: 99,
        state_type_id: 0,
    };
    let mut ext = MetadataExtension {
        extension_base: InternalExtension {
            struct_size: size_of::<MetadataExtension>(),
            kind: 1,
            next: std::ptr::null_mut(),
        },
        metadata: &mut meta,
    };
    // SAFETY: an all-empty frame whose only extension is the metadata query, as XLA sends it.
    let mut frame: CallFrame = unsafe { std::mem::zeroed() };
    frame.struct_size = size_of::<CallFrame>();
    frame.api = &api;
    frame.extension_start = (&mut ext as *mut MetadataExtension).cast();
    // SAFETY: as above.
    let err = unsafe { ffi::handle(lib, &mut frame) };
    assert!(err.is_null(), "the metadata query failed");
    assert_eq!(meta.traits, 0);
    (
        meta.api_version.major_version,
        meta.api_version.minor_version,
    )
}
