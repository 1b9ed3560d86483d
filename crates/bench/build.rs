//! Compiles the counting sink (`ebpf/sink.bpf.c`) that fanout-bench drops
//! every copy with, with clang (through `bpf-build`).
fn main() {
    bpf_build::compile("sink", "the counting sink needs");
}
