//! For build scripts: compiles a crate's eBPF programs, written in C
//! (`ebpf/NAME.bpf.c`), with clang into `$OUT_DIR/NAME.bpf.o`, as BPF
//! bytecode with BTF (aya's loader needs it for spin locks in map values
//! and for global variables). The crate then embeds the object with
//! `include_bytes!(concat!(env!("OUT_DIR"), "/NAME.bpf.o"))`.
//!
//! `make test` installs clang and libbpf's headers (scripts/install-deps.sh);
//! without them the build stops and says so. `BPF_CLANG` names another
//! clang.
#![deny(unsafe_code)]

use std::path::PathBuf;
use std::process::Command;

/// Compiles `ebpf/{name}.bpf.c` (relative to the crate being built) into
/// `$OUT_DIR/{name}.bpf.o`, and tells cargo to build again when it or
/// `BPF_CLANG` changes (headers it includes are the caller's to name with
/// `cargo:rerun-if-changed`). On failure it panics with a message that
/// starts `{needs} clang and libbpf's headers`, e.g. `needs` = "the
/// AF_XDP mode needs".
pub fn compile(name: &str, needs: &str) {
    println!("cargo:rerun-if-env-changed=BPF_CLANG");
    let src = format!("ebpf/{name}.bpf.c");
    println!("cargo:rerun-if-changed={src}");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR")).join(format!("{name}.bpf.o"));
    let clang = std::env::var("BPF_CLANG").unwrap_or_else(|_| "clang".into());
    // The multiarch include directory holds <asm/types.h>, which the
    // kernel's uapi headers include; the BPF target does not search it.
    let multiarch = format!("/usr/include/{}-linux-gnu", std::env::consts::ARCH);
    let status = Command::new(&clang)
        .args(["-O2", "-g", "-target", "bpf", "-Wall", "-Werror"])
        .arg(format!("-I{multiarch}"))
        // Headers the build script generated (e.g. the server's protocol
        // constants from reflector-proto) sit in OUT_DIR.
        .arg(format!("-I{}", out.parent().expect("OUT_DIR").display()))
        .args(["-c", &src, "-o"])
        .arg(&out)
        .status();
    match status {
        Ok(s) if s.success() => {}
        Ok(s) => panic!("{clang} failed to compile {src} ({s}); {needs} clang and libbpf's headers (libbpf-dev): run scripts/install-deps.sh"),
        Err(e) => panic!("cannot run {clang} to compile {src}: {e}; install clang, llvm and libbpf-dev (scripts/install-deps.sh), or set BPF_CLANG"),
    }
}
