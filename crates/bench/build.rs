//! Compiles the counting sink (`ebpf/sink.bpf.c`) that fanout-bench drops
//! every copy with, with clang (through `bpf-build`), after writing the
//! protocol constants it uses from `reflector-proto` into
//! `$OUT_DIR/reflector_proto.h`.
fn main() {
    let out = std::path::PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let header = out.join("reflector_proto.h");
    std::fs::write(&header, reflector_proto::protocol::c_defines())
        .unwrap_or_else(|e| panic!("cannot write {}: {e}", header.display()));
    bpf_build::compile("sink", "the counting sink needs");
}
