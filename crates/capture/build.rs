//! Compiles the AF_XDP mode's XDP program (`ebpf/xsk.bpf.c`) with clang
//! (through `bpf-build`).
fn main() {
    bpf_build::compile("xsk", "the AF_XDP mode needs");
}
