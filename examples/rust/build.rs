// Links libdsa_kernels from DSA_KERNELS_LIB_DIR (the folder holding libdsa_kernels.so).
fn main() {
    println!("cargo:rerun-if-env-changed=DSA_KERNELS_LIB_DIR");
    if let Ok(dir) = std::env::var("DSA_KERNELS_LIB_DIR") {
        println!("cargo:rustc-link-search=native={dir}");
        println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
    }
    println!("cargo:rustc-link-lib=dylib=dsa_kernels");
}
