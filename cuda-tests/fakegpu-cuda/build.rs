fn main() {
    // Real clients find this library by its SONAME; `fakegpu install` copies it under that name.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcuda.so.1");
    // Calls and address-of between our own exports bind locally. cuGetProcAddress hands out
    // `fn as pointer` values; without this, a preloaded library exporting the same names
    // (the gpuslice shim) could interpose on them and we would return its pointers instead
    // of the ones `dlsym(libcuda, name)` returns.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-Bsymbolic-functions");
}
