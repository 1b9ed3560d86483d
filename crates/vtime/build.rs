//! Builds the LD_PRELOAD shim (C) into a shared object that `src/shim.rs`
//! embeds with `include_bytes!`, so the `vtime` binary is all a user needs.
//!
//! The `cc` crate finds the C compiler and its flags for the target; it builds
//! static archives itself, so the shared-object link is one compiler call here.
use std::env;
use std::path::PathBuf;
use std::process::Command;

fn main() {
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let so = out.join("libvtime_shim.so");
    let sources = ["shim/vtime_shim.c", "shim/vtime_timers.c"];
    for f in sources.iter().chain(&["shim/vtime_shim.h", "shim/vtime_record.h"]) {
        println!("cargo:rerun-if-changed={f}");
    }
    let compiler = cc::Build::new()
        .opt_level(2)
        .pic(true)
        .warnings(true)
        .extra_warnings(true)
        .get_compiler();
    let mut cmd: Command = compiler.to_command();
    cmd.args([
        "-shared",
        "-fvisibility=hidden",
        "-o",
        so.to_str().expect("OUT_DIR is UTF-8"),
    ]);
    cmd.args(sources);
    cmd.args(["-ldl", "-lpthread"]);
    let status = cmd
        .status()
        .unwrap_or_else(|e| panic!("cannot run the C compiler ({cmd:?}): {e}; install a C compiler (gcc or clang)"));
    assert!(status.success(), "building the vtime shim failed: {cmd:?}");
}
