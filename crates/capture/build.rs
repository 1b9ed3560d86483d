//! Compiles the AF_XDP mode's XDP program (`ebpf/xsk.bpf.c`) with clang, as
//! BPF bytecode with BTF. `make test` installs clang and libbpf's headers
//! (scripts/install-deps.sh); without them the build stops here and says so.
use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=BPF_CLANG");
    let src = "ebpf/xsk.bpf.c";
    println!("cargo:rerun-if-changed={src}");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR")).join("xsk.bpf.o");
    let clang = std::env::var("BPF_CLANG").unwrap_or_else(|_| "clang".into());
    // The multiarch include directory holds <asm/types.h>, which the
    // kernel's uapi headers include; the BPF target does not search it.
    let multiarch = format!("/usr/include/{}-linux-gnu", std::env::consts::ARCH);
    let status = Command::new(&clang)
        .args(["-O2", "-g", "-target", "bpf", "-Wall", "-Werror"])
        .arg(format!("-I{multiarch}"))
        .args(["-c", src, "-o"])
        .arg(&out)
        .status();
    match status {
        Ok(s) if s.success() => {}
        Ok(s) => panic!("{clang} failed to compile {src} ({s}); the AF_XDP mode needs clang and libbpf's headers (libbpf-dev): run scripts/install-deps.sh"),
        Err(e) => panic!("cannot run {clang} to compile {src}: {e}; install clang, llvm and libbpf-dev (scripts/install-deps.sh), or set BPF_CLANG"),
    }
}
