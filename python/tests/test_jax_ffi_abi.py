"""The XLA FFI structs as our Rust handler lays them out (kernel-runtime/src/export/ffi.rs, written
after xla/ffi/api/c_api.h) against the header jaxlib ships, compiled by the C compiler: a field moved
by a jaxlib upgrade fails here instead of corrupting memory at run time."""
import subprocess

import jax

import tpu_kernel.examples as ex

FIELDS = {
    "XLA_FFI_Buffer_STRUCT_SIZE": "XLA_FFI_Buffer_STRUCT_SIZE",
    "XLA_FFI_CallFrame_STRUCT_SIZE": "XLA_FFI_CallFrame_STRUCT_SIZE",
    "XLA_FFI_Metadata_STRUCT_SIZE": "XLA_FFI_Metadata_STRUCT_SIZE",
    "XLA_FFI_Api_Version_STRUCT_SIZE": "XLA_FFI_Api_Version_STRUCT_SIZE",
    "XLA_FFI_Error_Create_Args_STRUCT_SIZE": "XLA_FFI_Error_Create_Args_STRUCT_SIZE",
    "offsetof(XLA_FFI_CallFrame, api)": "offsetof(XLA_FFI_CallFrame, api)",
    "offsetof(XLA_FFI_CallFrame, stage)": "offsetof(XLA_FFI_CallFrame, stage)",
    "offsetof(XLA_FFI_CallFrame, args)": "offsetof(XLA_FFI_CallFrame, args)",
    "offsetof(XLA_FFI_CallFrame, rets)": "offsetof(XLA_FFI_CallFrame, rets)",
    "offsetof(XLA_FFI_CallFrame, attrs)": "offsetof(XLA_FFI_CallFrame, attrs)",
    "offsetof(XLA_FFI_Buffer, dims)": "offsetof(XLA_FFI_Buffer, dims)",
    "offsetof(XLA_FFI_Attrs, attrs)": "offsetof(XLA_FFI_Attrs, attrs)",
    "offsetof(XLA_FFI_Api, XLA_FFI_Error_Create)": "offsetof(XLA_FFI_Api, XLA_FFI_Error_Create)",
    "offsetof(XLA_FFI_Metadata, traits)": "offsetof(XLA_FFI_Metadata, traits)",
    "offsetof(XLA_FFI_Metadata_Extension, metadata)": "offsetof(XLA_FFI_Metadata_Extension, metadata)",
    "offsetof(XLA_FFI_Api, XLA_FFI_RunId_Get)": "offsetof(XLA_FFI_Api, XLA_FFI_RunId_Get)",
    "offsetof(XLA_FFI_Api, XLA_FFI_DeviceOrdinal_Get)": "offsetof(XLA_FFI_Api, XLA_FFI_DeviceOrdinal_Get)",
    "XLA_FFI_RunId_Get_Args_STRUCT_SIZE": "XLA_FFI_RunId_Get_Args_STRUCT_SIZE",
    "XLA_FFI_DeviceOrdinal_Get_Args_STRUCT_SIZE": "XLA_FFI_DeviceOrdinal_Get_Args_STRUCT_SIZE",
}


def test_ffi_structs_match_jaxlibs_c_header(tmp_path):
    answer = ex.library.call("ffi_layout", {})
    assert answer["ok"], answer
    ours = answer["layout"]
    assert set(ours) == set(FIELDS), "a field was added on one side only"
    prints = "\n".join(f'  printf("%s=%zu\\n", "{k}", (size_t)({v}));' for k, v in FIELDS.items())
    src = tmp_path / "layout.c"
    src.write_text(
        "#include <stdio.h>\n#include <stddef.h>\n#include \"xla/ffi/api/c_api.h\"\n"
        f"int main(void) {{\n{prints}\n  printf(\"api=%d.%d\\n\", XLA_FFI_API_MAJOR, XLA_FFI_API_MINOR);\n"
        "  return 0;\n}\n")
    exe = tmp_path / "layout"
    subprocess.run(["cc", "-I", jax.ffi.include_dir(), str(src), "-o", str(exe)], check=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    header = dict(line.split("=", 1) for line in out.strip().splitlines())
    for key, value in ours.items():
        assert int(header[key]) == value, f"{key}: header {header[key]}, ours {value}"
    assert header["api"] == "%d.%d" % tuple(answer["api_version"])
