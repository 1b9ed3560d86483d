//! `--backend sendmmsg`: the same copies as `sendto`, one `sendmmsg` per
//! batch of members (each group's destinations kept as prebuilt message
//! headers).

use super::{Fanout, FanoutBackend, RateCaps, Started, Support};
use crate::backend::user::UserFanout;
use std::net::IpAddr;
use std::sync::Arc;

/// One `sendmmsg` per batch of members.
pub struct Sendmmsg;

impl FanoutBackend for Sendmmsg {
    const NAME: &'static str = "sendmmsg";
    const HELP: &'static str = "One `sendmmsg` per batch of members.";

    /// Linux has had `sendmmsg` since 3.0; a seccomp filter can still
    /// forbid it.
    fn probe() -> Support {
        match sendpath::probe_sendmmsg() {
            Ok(()) => Support::Supported,
            Err(e) => Support::Unsupported(format!("sendmmsg is not available: {e}")),
        }
    }

    fn start(_bind: IpAddr, _caps: RateCaps) -> Result<Arc<dyn Started>, String> {
        match Self::probe() {
            Support::Supported => Ok(Arc::new(Sendmmsg)),
            Support::Unsupported(why) => Err(why),
        }
    }
}

impl Started for Sendmmsg {
    fn for_loop(&self) -> Box<dyn Fanout> {
        Box::new(UserFanout::sendmmsg())
    }
}
