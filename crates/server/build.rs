//! Compiles the in-kernel fan-out program (`ebpf/fanout.bpf.c`) with clang
//! (through `bpf-build`), as BPF bytecode with BTF (the loader needs it for
//! the spin lock in the member map). The protocol's constants and header
//! offsets it needs are generated first from `reflector-proto` into
//! `$OUT_DIR/reflector_proto.h`, so the C program cannot drift from the
//! crate that defines the wire format.
fn main() {
    println!("cargo:rerun-if-changed=ebpf/fanout.h");
    let out = std::path::PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let header = out.join("reflector_proto.h");
    std::fs::write(&header, reflector_proto::protocol::c_defines())
        .unwrap_or_else(|e| panic!("cannot write {}: {e}", header.display()));
    bpf_build::compile("fanout", "the eBPF programs need");
}
