//! A counting sink for the benchmarks (`ebpf/sink.bpf.c`, compiled by
//! `build.rs`): every DATA datagram crossing a device's egress (or ingress)
//! is counted and taken away. Attached with a TCX link held by this value:
//! dropping it detaches it.

use aya::maps::{MapData, PerCpuArray};
use aya::programs::links::LinkOrder;
use aya::programs::tc::TcAttachOptions;
use aya::programs::{SchedClassifier, TcAttachType};
use aya::Ebpf;

// The program tells our DATA datagrams from everything else by the magic,
// the type and its offset, generated from reflector-proto by build.rs.

#[repr(C, align(8))]
struct Aligned<T: ?Sized>(T);

/// The compiled program, 8-byte aligned as the ELF parser wants it.
fn object() -> &'static [u8] {
    static OBJ: &Aligned<[u8]> = &Aligned(*include_bytes!(concat!(env!("OUT_DIR"), "/sink.bpf.o")));
    &OBJ.0
}

pub struct Sink {
    _ebpf: Ebpf,
    sunk: PerCpuArray<MapData, u64>,
}

impl Sink {
    /// On `dev` (in the calling thread's namespace): on its egress, handing
    /// what it takes to the device `to`, which must free it (a dummy, or a
    /// veth whose peer is down; a drop on
    /// egress would be an ENOBUFS for the sender), or, with `to` = `None`,
    /// on its ingress before every other program, dropping it.
    pub fn attach(dev: &str, to: Option<&str>) -> Result<Sink, String> {
        let target = match to {
            Some(d) => nix::net::if_::if_nametoindex(d).map_err(|e| format!("no device {d}: {e}"))?,
            None => 0,
        };
        let mut ebpf = aya::EbpfLoader::new()
            .override_global("sink_ifindex", &target, true)
            .load(object())
            .map_err(|e| format!("cannot load the sink: {e}"))?;
        let prog: &mut SchedClassifier = ebpf
            .program_mut("reflector_sink")
            .and_then(|p| p.try_into().ok())
            .ok_or("the sink object has no TC program")?;
        prog.load().map_err(|e| format!("the kernel refused the sink: {e}"))?;
        let (kind, order) = if to.is_some() {
            (TcAttachType::Egress, LinkOrder::default())
        } else {
            (TcAttachType::Ingress, LinkOrder::first())
        };
        prog.attach_with_options(dev, kind, TcAttachOptions::TcxOrder(order))
            .map_err(|e| format!("cannot attach the sink to {dev}: {e}"))?;
        let map = ebpf.take_map("sunk").ok_or("the sink object has no map sunk")?;
        let sunk = PerCpuArray::try_from(map).map_err(|e| format!("map sunk: {e}"))?;
        Ok(Sink { _ebpf: ebpf, sunk })
    }

    /// DATA datagrams dropped so far.
    pub fn count(&self) -> u64 {
        self.sunk.get(&0, 0).map(|v| v.iter().sum()).unwrap_or(0)
    }

    /// DATA datagrams dropped so far, per CPU (index = CPU number): where
    /// the sink ran, which is where the datagram's transmit ran.
    pub fn count_per_cpu(&self) -> Vec<u64> {
        self.sunk
            .get(&0, 0)
            .map(|v| v.iter().copied().collect())
            .unwrap_or_default()
    }
}
