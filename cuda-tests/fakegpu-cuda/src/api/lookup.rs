//! Lookup and errors (usable before `cuInit`): `cuGetProcAddress`, error names and strings, `cuGetExportTable`.

use crate::*;

pub(crate) fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
) -> R<()> {
    get_proc_address(symbol, pfn, version, flags, std::ptr::null_mut())
}

pub(crate) fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
    status: *mut c_int,
) -> R<()> {
    get_proc_address(symbol, pfn, version, flags, status)
}

pub(crate) fn cuGetErrorName(error: CUresult, s: *mut *const c_char) -> R<()> {
    match result::name(error) {
        Some(n) => put(s, c_static(n)),
        None => {
            put_opt(s, std::ptr::null());
            Err(CUDA_ERROR_INVALID_VALUE)
        }
    }
}

pub(crate) fn cuGetErrorString(error: CUresult, s: *mut *const c_char) -> R<()> {
    match error_string(error).or_else(|| result::name(error)) {
        Some(n) => put(s, c_static(n)),
        None => {
            put_opt(s, std::ptr::null());
            Err(CUDA_ERROR_INVALID_VALUE)
        }
    }
}

pub(crate) fn cuGetExportTable(table: *mut *const c_void, id: *const CUuuid) -> R<()> {
    export_tables::get_export_table(table, id)
}

fn get_proc_address(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
    status: *mut c_int,
) -> R<()> {
    if pfn.is_null() || symbol.is_null() || flags > CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let name = cstr(symbol).unwrap_or("");
    let r = lookup(proc_table(), name, version, flags, cu().driver_version());
    trace_lookup(name, version, flags, r);
    let (ptr, st, res) = match r {
        Lookup::Found(p) => (p, CU_GET_PROC_ADDRESS_SUCCESS, Ok(())),
        Lookup::NotFound => (
            0,
            CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND,
            Err(CUDA_ERROR_NOT_FOUND),
        ),
        Lookup::VersionNotSufficient => (
            0,
            CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT,
            Err(CUDA_ERROR_NOT_FOUND),
        ),
    };
    put(pfn, ptr as *mut c_void)?;
    put_opt(status, st);
    res
}

/// `FAKEGPU_TRACE_PROCS=1`: one line per `cuGetProcAddress` lookup (name, version, flags,
/// answer), how the tables of names each client asks for were made.
fn trace_lookup(name: &str, version: c_int, flags: u64, r: Lookup) {
    static ON: OnceLock<bool> = OnceLock::new();
    if *ON.get_or_init(|| std::env::var_os("FAKEGPU_TRACE_PROCS").is_some_and(|v| v != "0")) {
        let answer = match r {
            Lookup::Found(_) => "found",
            Lookup::NotFound => "not-found",
            Lookup::VersionNotSufficient => "version-not-sufficient",
        };
        eprintln!("fakegpu: cuGetProcAddress {name} {version} {flags} {answer}");
    }
}

fn error_string(code: CUresult) -> Option<&'static str> {
    Some(match code {
        CUDA_SUCCESS => "no error",
        CUDA_ERROR_INVALID_VALUE => "invalid argument",
        CUDA_ERROR_OUT_OF_MEMORY => "out of memory",
        CUDA_ERROR_NOT_INITIALIZED => "initialization error",
        CUDA_ERROR_DEINITIALIZED => "driver shutting down",
        CUDA_ERROR_NO_DEVICE => "no CUDA-capable device is detected",
        CUDA_ERROR_INVALID_DEVICE => "invalid device ordinal",
        CUDA_ERROR_INVALID_CONTEXT => "invalid device context",
        CUDA_ERROR_INVALID_HANDLE => "invalid resource handle",
        CUDA_ERROR_NOT_FOUND => "named symbol not found",
        CUDA_ERROR_NOT_READY => "device not ready",
        CUDA_ERROR_FILE_NOT_FOUND => "file not found",
        CUDA_ERROR_INVALID_IMAGE => "device kernel image is invalid",
        CUDA_ERROR_NO_BINARY_FOR_GPU => "no kernel image is available for execution on the device",
        CUDA_ERROR_UNSUPPORTED_PTX_VERSION => {
            "the provided PTX was compiled with an unsupported toolchain."
        }
        CUDA_ERROR_UNKNOWN => "unknown error",
        _ => return None,
    })
}

/// Static C strings for error names and descriptions.
fn c_static(s: &'static str) -> *const c_char {
    static CACHE: OnceLock<std::sync::Mutex<std::collections::HashMap<&'static str, CString>>> =
        OnceLock::new();
    let mut m = CACHE
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    m.entry(s)
        .or_insert_with(|| CString::new(s).expect("no NUL in messages"))
        .as_ptr()
}
