//! End to end on loopback, small and bounded: the harness drives each
//! implementation as a child process and counts every copy exactly.
//! (Speed is not asserted here; that is what `make bench` is for.)

use bench::grid::{Amount, Cell, Impl, Run};
use bench::loadgen::{Harness, WorkDir};
use reflector_server::backend::Support;
use std::path::PathBuf;

fn harness(reflector: PathBuf) -> (Harness, WorkDir) {
    let dir = WorkDir::create_unique("test").unwrap();
    let h = Harness::new(
        reflector,
        PathBuf::from(env!("CARGO_BIN_EXE_reflector-bench")),
        1 << 20,
        32,
        Amount::Copies(6_000),
        None,
        &dir.0,
    )
    .unwrap();
    (h, dir)
}

fn check(h: &Harness, imp: Impl) {
    let cell = Cell {
        size: 100,
        receivers: 3,
    };
    let m = h.measure(&Run { cell, imp, rep: 0 }).unwrap();
    // 6000 copies over 3 receivers = 2000 datagrams (the minimum is 1000).
    assert_eq!(m.datagrams, 2_000, "{imp}");
    assert_eq!(m.copies_expected, 6_000, "{imp}");
    assert_eq!(m.copies_received, 6_000, "{imp}: every copy arrives");
    assert_eq!(m.bad_copies, 0, "{imp}");
    assert_eq!(m.send_errors, 0, "{imp}");
    assert_eq!(
        m.counter_mismatch, 0,
        "{imp}: its own sent counter matches what arrived"
    );
    assert!(m.wall_s > 0.0);
}

#[test]
fn raw_loop_delivers_every_copy() {
    let (h, _dir) = harness(PathBuf::from("/nonexistent"));
    check(&h, Impl::RawLoop);
}

#[test]
fn reflector_backends_deliver_every_copy() {
    // The reflector binary of the same build, when it has been built
    // (`cargo test --workspace` builds it for the reflector's own tests).
    let reflector = PathBuf::from(env!("CARGO_BIN_EXE_reflector-bench")).with_file_name("reflector");
    if !reflector.is_file() {
        eprintln!(
            "skipping reflector_backends_deliver_every_copy: no reflector binary at {}",
            reflector.display()
        );
        return;
    }
    let (h, _dir) = harness(reflector);
    // Every reflector implementation reflector-bench knows (each loopback
    // fan-out backend with each receive backend, tags on and off).
    for imp in Impl::all().into_iter().filter(|i| *i != Impl::RawLoop) {
        if let Support::Unsupported(why) = imp.receive().probe() {
            assert!(
                std::env::var("REQUIRE_ROOT_TESTS").as_deref() != Ok("1"),
                "{imp} is unsupported here ({why}), and CI forbids skipping it"
            );
            eprintln!("skipping {imp}: {why}");
            continue;
        }
        check(&h, imp);
    }
}
