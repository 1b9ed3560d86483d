//! Compiles the in-kernel fan-out program (`ebpf/fanout.bpf.c`) with clang
//! (through `bpf-build`), as BPF bytecode with BTF (the loader needs it for
//! the spin lock in the member map).
fn main() {
    println!("cargo:rerun-if-changed=ebpf/fanout.h");
    bpf_build::compile("fanout", "the eBPF programs need");
}
