//! Compiles the in-kernel fan-out program (`ebpf/fanout.bpf.c`) and the
//! counting sink the tests and benchmarks use (`ebpf/sink.bpf.c`) with clang,
//! as BPF bytecode with BTF (the loader needs it for the spin lock in the
//! member map). `make test` installs clang and libbpf's headers
//! (scripts/install-deps.sh); without them the build stops here and says so.
use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=ebpf/fanout.h");
    println!("cargo:rerun-if-env-changed=BPF_CLANG");
    for name in ["fanout", "sink"] {
        compile(name);
    }
}

fn compile(name: &str) {
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
        .args(["-c", &src, "-o"])
        .arg(&out)
        .status();
    match status {
        Ok(s) if s.success() => {}
        Ok(s) => panic!("{clang} failed to compile {src} ({s}); the eBPF programs need clang and libbpf's headers (libbpf-dev): run scripts/install-deps.sh"),
        Err(e) => panic!("cannot run {clang} to compile {src}: {e}; install clang, llvm and libbpf-dev (scripts/install-deps.sh), or set BPF_CLANG"),
    }
}
