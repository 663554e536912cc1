fn main() {
    // Real clients find this library by its SONAME; `fakegpu install` copies it under that name.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcuda.so.1");
}
