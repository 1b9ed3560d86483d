//! The `capture gen` subcommand (of the binary): its arguments and its run
//! of the library's packet generator.

use std::net::SocketAddrV4;
use std::process::ExitCode;
use std::sync::atomic::Ordering;

use capture::gen::{self, FrameSpec, GenConfig, Via};
use clap::Args;

use crate::secs;

#[derive(Args, Debug)]
pub(crate) struct GenArgs {
    /// Interface to send on (required for mmsg and txring; binds the socket for udp).
    #[arg(short = 'i', long = "interface", value_name = "IFACE")]
    iface: Option<String>,
    /// How to send: udp (UDP socket + sendmmsg), mmsg (raw frames + sendmmsg), txring (raw frames via TX ring).
    #[arg(long, default_value = "udp")]
    via: Via,
    /// Destination address and port.
    #[arg(long, value_name = "IP:PORT")]
    dst: SocketAddrV4,
    /// Source address and port (raw frames use it in the header; udp binds to it).
    #[arg(long, value_name = "IP:PORT", default_value = "0.0.0.0:0")]
    src: SocketAddrV4,
    /// Destination MAC for raw frames (default broadcast).
    #[arg(long, value_name = "MAC", default_value = "ff:ff:ff:ff:ff:ff")]
    dst_mac: String,
    /// Put an 802.1Q tag with this VLAN id (1-4094) in each raw frame (mmsg, txring).
    #[arg(long, value_name = "ID", value_parser = clap::value_parser!(u16).range(1..=4094))]
    vlan: Option<u16>,
    /// Frame size in bytes, Ethernet header included, FCS excluded (min 50).
    #[arg(long, default_value_t = 64)]
    size: usize,
    /// Packets per second (0: as fast as possible).
    #[arg(long, default_value_t = 0)]
    rate: u64,
    /// Number of packets.
    #[arg(short = 'c', long = "count", value_name = "COUNT")]
    count: Option<u64>,
    /// Seconds to send for.
    #[arg(long, value_name = "SECS")]
    duration: Option<f64>,
    /// Packets per syscall at most.
    #[arg(long, default_value_t = 64)]
    batch: usize,
    /// Print the result as one CSV line: sent,seconds,pps,syscalls
    #[arg(long)]
    csv: bool,
}

pub(crate) fn run_gen(a: GenArgs) -> Result<ExitCode, capture::CaptureError> {
    let duration = secs(a.duration, "--duration")?;
    if a.vlan.is_some() && a.via == gen::Via::Udp {
        return Err(capture::CaptureError::Config(
            "--vlan tags raw frames: use it with --via mmsg or --via txring (a UDP socket's frames are built by the kernel)".into(),
        ));
    }
    let dst_mac = gen::parse_mac(&a.dst_mac).ok_or_else(|| {
        capture::CaptureError::Config(format!("bad --dst-mac '{}': use aa:bb:cc:dd:ee:ff", a.dst_mac))
    })?;
    let src_mac = a
        .iface
        .as_deref()
        .and_then(gen::iface_mac)
        .unwrap_or([2, 0, 0, 0, 0, 1]);
    let cfg = GenConfig {
        via: a.via,
        iface: a.iface.clone(),
        spec: FrameSpec {
            src_mac,
            dst_mac,
            src: a.src,
            dst: a.dst,
            frame_len: a.size,
            vlan: a.vlan,
        },
        rate: a.rate,
        count: a.count,
        duration,
        batch: a.batch,
    };
    use oskit::signal::{flag_on, Second, SIGINT, SIGTERM};
    let stop = flag_on(&[SIGINT, SIGTERM], Second::Ignore)
        .map_err(|e| capture::CaptureError::Config(format!("cannot install signal handlers: {e}")))?;
    let quiet = a.csv;
    let r = gen::generate(&cfg, &stop, &mut |sent, el| {
        if !quiet {
            eprintln!(
                "gen: {sent} sent in {:.1}s ({:.0} pps)",
                el.as_secs_f64(),
                sent as f64 / el.as_secs_f64()
            );
        }
    })?;
    if a.csv {
        println!(
            "{},{:.6},{:.0},{}",
            r.sent,
            r.elapsed.as_secs_f64(),
            r.rate(),
            r.syscalls
        );
    } else {
        eprintln!(
            "gen: sent {} packets of {} bytes via {} in {:.3}s: {:.0} pps (target {}), {} syscalls{}",
            r.sent,
            a.size,
            a.via,
            r.elapsed.as_secs_f64(),
            r.rate(),
            if a.rate == 0 {
                "max".to_string()
            } else {
                a.rate.to_string()
            },
            r.syscalls,
            if r.rejected > 0 {
                format!(", {} rejected by the kernel", r.rejected)
            } else {
                String::new()
            }
        );
    }
    if stop.load(Ordering::Relaxed) {
        return Ok(ExitCode::from(130));
    }
    Ok(ExitCode::SUCCESS)
}
