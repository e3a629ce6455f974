//! Builds the BPF object that the agent embeds, and generates the Rust side
//! of the shared ABI (bpf/writebehind.h) with bindgen, so the structs that
//! cross the ring buffer and the maps are defined once, in C.

use std::{env, path::PathBuf, process::Command};

fn main() {
    let bpf_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap()).join("../bpf");
    let out = PathBuf::from(env::var("OUT_DIR").unwrap());
    // A directory: cargo reruns this when any file in it changes (the
    // programs' headers, one .bpf.c).
    println!("cargo:rerun-if-changed={}", bpf_dir.display());
    println!("cargo:rerun-if-env-changed=CLANG");

    let clang = env::var("CLANG").unwrap_or_else(|_| "clang".into());
    // The object for kernels with bpf_loop (5.17+), and the compat one for
    // those without (see bpf/compat.bpf.h).
    for (name, defines) in [("writebehind.bpf.o", &[][..]), ("writebehind-compat.bpf.o", &["-DWB_COMPAT"][..])] {
        let status = Command::new(&clang)
            .args(["-O2", "-g", "-Wall", "-Werror", "-target", "bpf", "-D__TARGET_ARCH_x86"])
            .args(defines)
            .arg("-I")
            .arg(&bpf_dir)
            .arg("-c")
            .arg(bpf_dir.join("writebehind.bpf.c"))
            .arg("-o")
            .arg(out.join(name))
            .status()
            .unwrap_or_else(|e| panic!("cannot run {clang}: {e}; install clang and libbpf-dev (see .ci/run)"));
        assert!(status.success(), "{clang} failed to build bpf/writebehind.bpf.c {defines:?}");
    }

    bindgen::Builder::default()
        .header(bpf_dir.join("writebehind.h").to_string_lossy())
        .allowlist_type("wb_.*")
        .allowlist_var("WB_.*")
        .rustified_enum("wb_event_kind|wb_stat")
        .derive_default(true)
        .derive_partialeq(true)
        .layout_tests(true)
        .generate()
        .expect("bindgen failed on bpf/writebehind.h")
        .write_to_file(out.join("abi.rs"))
        .expect("cannot write abi.rs");
}
