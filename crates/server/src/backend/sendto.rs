//! `--backend sendto`: the paper's user-space loop (§4.1), one `sendto`
//! per member.

use super::{Fanout, FanoutBackend, RateCaps, Started, Support};
use crate::backend::user::{Mode, UserFanout};
use std::net::IpAddr;
use std::sync::Arc;

/// One `sendto` per member; nothing to set up beyond the groups' sockets.
pub struct Sendto;

impl FanoutBackend for Sendto {
    const NAME: &'static str = "sendto";
    const HELP: &'static str = "One `sendto` per member (the paper's user-space loop).";

    /// Plain sockets: every kernel the reflector runs on.
    fn probe() -> Support {
        Support::Supported
    }

    fn start(_bind: IpAddr, _caps: RateCaps) -> Result<Arc<dyn Started>, String> {
        Ok(Arc::new(Sendto))
    }
}

impl Started for Sendto {
    fn for_loop(&self) -> Box<dyn Fanout> {
        Box::new(UserFanout::new(Mode::Sendto))
    }
}
